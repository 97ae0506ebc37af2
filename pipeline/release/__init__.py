"""The release: what ``prb publish`` writes, and what every reader of one relies on.

- ``columns``: the release row as one table (each column's type, group and check), with
  the ``datasets`` Features, the row builder and the row checker derived from it;
- ``recorded``: what a release records about how it was made (the pair stage it was
  built from, the rules its pairs were filtered with, the profile ranking) and the check
  that a release inside a run still matches the run (a command layer module: it reads the
  run directory).

``prb publish`` writes releases, ``prb audit`` and ``prb eval`` read them; all three take
the columns from here, so none borrows another's definition.
"""

from pipeline.release.columns import (
    ASPECT_FIELDS,
    COLUMNS,
    GROUPS,
    PRIVILEGED_COLUMNS,
    PROFILE_FIELDS,
    REFERENCE_COLUMNS,
    REQUIRED_COLUMNS,
    Column,
    build_row,
    check_row,
    credited,
    features,
    generator_model,
    sampling_of,
    templates_of,
)

__all__ = [
    "ASPECT_FIELDS",
    "COLUMNS",
    "GROUPS",
    "PRIVILEGED_COLUMNS",
    "PROFILE_FIELDS",
    "REFERENCE_COLUMNS",
    "REQUIRED_COLUMNS",
    "Column",
    "build_row",
    "check_row",
    "credited",
    "features",
    "generator_model",
    "sampling_of",
    "templates_of",
]
