"""publish: the release of a run as a Hugging Face `datasets` dataset.

One parquet file per config (each category, plus ``all``) under ``<out>/<config>/``, a
dataset card ``README.md`` whose YAML header lists the configs (each naming its data
file's sha256, so ``datasets`` never serves one release's cached rows for another's: see
``card.card_configs``), ``release.json`` with the card's figures in machine-readable form
and what the release records about how it was made, and the marker ``.prb-release`` with
the manifest of the files written. The columns are the release table's
(:mod:`pipeline.release`): the reference benchmark's eight first, in its names and types,
so its evaluation code loads the release unchanged; ours follow.

Rooms, one concern each:

- ``select``: the policies and which kept pairs they publish;
- ``summary``: every figure the card and release.json report;
- ``card``: the dataset card (YAML header and prose);
- ``folder``: the release folder (where it may go, its manifest, replacing it safely);
- ``targets``: the Hugging Face Hub;
- ``make``: :func:`publish`, which runs them in order.

The human verdicts come from the annotate package (``pipeline.annotate.rounds``).
"""

from pipeline.publish.card import DATA_FILE, REFERENCE_SUBSETS
from pipeline.publish.make import DEFAULT_LICENSE, publish
from pipeline.publish.select import POLICIES

__all__ = ["DATA_FILE", "DEFAULT_LICENSE", "POLICIES", "REFERENCE_SUBSETS", "publish"]
