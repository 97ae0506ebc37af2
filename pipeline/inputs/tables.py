"""The table formats, read through ``datasets`` / ``pyarrow`` with a column mapping:

- ``hf``: a folder written by ``datasets`` ``save_to_disk`` (a Dataset or a DatasetDict,
  ``input.split`` picks the split) or a ``.parquet`` file.
- ``hub``: a dataset on the Hugging Face Hub (or a dataset repository folder), one or more
  configs and a split, loaded with ``datasets.load_dataset``: the ``datasets`` cache is
  used and offline mode (``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE``) honoured. Each
  config's name is the category of its rows that carry none.

``input.columns`` maps our field names to the source's column names; errors name the
source, the 1-based row and the column."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pipeline.core.errors import InputError
from pipeline.core.io import path_kind
from pipeline.core.modelfiles import hub_reachable as _hub_reachable
from pipeline.inputs.base import (
    DEFAULT_KEYS,
    FIELDS,
    InputFormat,
    InputSection,
    Loc,
    PathWant,
    Unique,
    example_row,
    ident,
    profile,
    question_fields,
    required,
)

# Our field names that a table source may map to its own column names.
HF_FIELDS = FIELDS
_REQUIRED = ("source_id", "question", "profile")

Wanted = Callable[[list[str]], list[str]]


class _Columns:
    """The column mapping of one input, checked against each table's columns."""

    def __init__(self, columns: Mapping[str, str], where: Path | str) -> None:
        unknown = sorted(set(columns) - set(HF_FIELDS))
        if unknown:
            raise InputError(
                f"input.columns names unknown field(s) {', '.join(map(repr, unknown))}; "
                f"known fields: {', '.join(HF_FIELDS)}",
                path=where,
                field=f"columns.{unknown[0]}",
            )
        self.mapped = dict(columns)
        self.keys = dict(DEFAULT_KEYS) | self.mapped
        self.present: dict[str, bool] = {}
        self.where = where

    def wanted(self, available: list[str]) -> list[str]:
        """The columns to read from a table with ``available`` columns; an error names a
        mapped or required column that is missing, or one read for two fields."""
        keys, columns, path = self.keys, self.mapped, self.where
        for name in HF_FIELDS:
            col = keys[name]
            self.present[name] = col in available
            if self.present[name]:
                continue
            if name in columns:
                raise InputError(
                    f"column {col!r} (mapped from field '{name}' in input.columns) not found; "
                    f"available columns: {', '.join(available)}",
                    path=path,
                    field=col,
                )
            if name in _REQUIRED:
                raise InputError(
                    f"required column {col!r} not found; available columns: "
                    f"{', '.join(available)}; map it with input.columns.{name}",
                    path=path,
                    field=col,
                )
        read = [n for n in HF_FIELDS if self.present[n]]
        for name in read:
            col = keys[name]
            if available.count(col) > 1:
                # a row becomes a dict: the last of the same-named columns would win silently
                raise InputError(
                    f"the source has {available.count(col)} columns named {col!r} (read for "
                    f"field '{name}'); drop or rename all but one, or map the field to another "
                    "column with input.columns",
                    path=path,
                    field=col,
                )
            others = [o for o in read if o != name and keys[o] == col]
            if others and (name in columns or others[0] in columns):
                raise InputError(
                    f"fields '{name}' and '{others[0]}' both read column {col!r}; map each "
                    "field to a column of its own in input.columns",
                    path=path,
                    field=f"columns.{name if name in columns else others[0]}",
                )
        return list(dict.fromkeys(keys[n] for n in read))

    def example(self, rec: Mapping[str, Any], loc: Loc, ids: Unique, category: str | None) -> dict:
        """One validated example from a table row; ``category`` fills a missing one."""
        keys = self.keys
        fields = question_fields(rec, loc, keys)
        ids.add(fields["source_id"], keys["source_id"], loc)
        if fields["category"] is None:
            fields["category"] = category
        k_user = keys["user_id"]
        uid = rec.get(k_user) if self.present["user_id"] else None
        uid = fields["source_id"] if uid is None else ident(uid, k_user, loc)
        k_prof = keys["profile"]
        posts = profile(required(rec, k_prof, k_prof, loc), k_prof, loc)
        return example_row(fields, uid, posts)


def _dataset_rows(ds: Any, wanted: Wanted) -> Iterator[dict]:
    """The chosen columns of a ``datasets.Dataset``, row by row, read in batches so a large
    input is never held whole."""
    ds = ds.select_columns(wanted(ds.column_names))
    for batch in ds.iter(batch_size=1024):  # columns of up to 1024 rows
        names = list(batch)
        for values in zip(*(batch[k] for k in names), strict=True):
            yield dict(zip(names, values, strict=True))


def _pick_split(ds: Any, split: str | None, where: Path | str) -> Any:
    """One split of a DatasetDict (``split`` or its only one); a Dataset as it is."""
    import datasets

    if not isinstance(ds, datasets.DatasetDict):
        return ds
    splits = sorted(ds)
    if split is None:
        if len(splits) != 1:
            raise InputError(
                f"the dataset holds several splits; set input.split to one of: {', '.join(splits)}",
                path=where,
                field="split",
            )
        split = splits[0]
    if split not in ds:
        raise InputError(
            f"split {split!r} not found; available splits: {', '.join(splits) or '(none)'}",
            path=where,
            field="split",
        )
    return ds[split]


# ---------------------------------------------------------------------------------------
# hf: a datasets folder or a parquet file


def _is_parquet(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() == ".parquet"


class HFFormat(InputFormat):
    summary = "a `datasets` folder or a parquet file with a column mapping."

    @classmethod
    def path_fields(cls, section: InputSection) -> list[tuple[str, Path | None, PathWant]]:
        return [("input.path", section.path, "folder or parquet file")]

    @classmethod
    def detect(cls, path: Path) -> bool:
        if _is_parquet(path):
            return True
        return path.is_dir() and any(
            (path / name).is_file() for name in ("dataset_info.json", "dataset_dict.json")
        )

    def _folder(self, path: Path) -> Any:
        """The chosen split of a saved dataset folder."""
        if not path.exists():
            raise InputError(
                "input dataset not found (expected a folder or a .parquet file)", path=path
            )
        if not path.is_dir():
            raise InputError(
                f"is {path_kind(path)}; hf input must be a folder saved with `datasets` "
                "save_to_disk or a .parquet file",
                path=path,
            )
        import datasets

        try:
            ds = datasets.load_from_disk(str(path))
        except FileNotFoundError:
            raise InputError(
                "not a `datasets` folder (no dataset_info.json or dataset_dict.json); "
                "write it with Dataset.save_to_disk or point input.path at a .parquet file",
                path=path,
            ) from None
        except Exception as exc:
            raise InputError(f"cannot load dataset folder: {exc}", path=path) from None
        return _pick_split(ds, self.section.split, path)

    def _rows(self, path: Path, wanted: Wanted) -> Iterator[dict]:
        if _is_parquet(path):
            import pyarrow.parquet as pq

            try:
                pf = pq.ParquetFile(path)
                batches = pf.iter_batches(batch_size=1024, columns=wanted(pf.schema_arrow.names))
                for batch in batches:
                    yield from batch.to_pylist()
            except InputError:
                raise
            except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ...
                raise InputError(f"cannot read parquet file: {exc}", path=path) from None
            return
        yield from _dataset_rows(self._folder(path), wanted)

    def count(self) -> int:
        path = self.need_path("path")
        if _is_parquet(path):
            import pyarrow.parquet as pq

            try:
                return int(pq.ParquetFile(path).metadata.num_rows)
            except Exception as exc:
                raise InputError(f"cannot read parquet file: {exc}", path=path) from None
        return len(self._folder(path))

    def read(self) -> Iterator[dict]:
        path = self.need_path("path")
        columns = _Columns(self.section.columns, path)
        ids = Unique("id")
        n = 0
        for n, rec in enumerate(self._rows(path, columns.wanted), start=1):
            yield columns.example(rec, Loc(path, n, unit="row"), ids, None)
        if n == 0:  # a run of 0 pairs is never what was meant
            split = self.section.split
            where = f" (split {split!r})" if split else ""
            raise InputError(
                f"the dataset{where} holds no rows; point input.path at the data", path=path
            )


# ---------------------------------------------------------------------------------------
# hub: datasets.load_dataset(name, config, split=...)


def _offline() -> bool:
    import datasets

    return bool(datasets.config.HF_HUB_OFFLINE)


@contextlib.contextmanager
def _offline_mode() -> Iterator[None]:
    """datasets and huggingface_hub in offline mode for one load: the cached copy is read,
    and a dataset that is not cached fails at once instead of retrying the Hub."""
    import datasets
    from huggingface_hub import constants

    saved = datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE = saved


def _local_cache(folder: Path, cache_dir: Path | None) -> Path:
    """A datasets cache of its own for a local dataset folder, keyed by the folder's real
    path and its files (relative path, size, modification time). ``datasets`` keys a local
    folder's cache entry by its name and layout, so two folders of one name (or a folder
    whose rows changed) shared an entry and the second read the first's rows, silently."""
    import hashlib

    import datasets

    real = folder.resolve()
    h = hashlib.sha256(str(real).encode())
    for p in sorted(real.rglob("*")):
        if p.is_file() and ".git" not in p.relative_to(real).parts:
            st = p.stat()
            h.update(f"{p.relative_to(real)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    base = cache_dir if cache_dir is not None else Path(datasets.config.HF_DATASETS_CACHE)
    return base / "prb-local" / h.hexdigest()[:16]


class HubFormat(InputFormat):
    summary = "a dataset on the Hugging Face Hub (input.dataset, input.configs, input.split)."

    @classmethod
    def path_fields(cls, section: InputSection) -> list[tuple[str, Path | None, PathWant]]:
        # a local repository folder is checked like an hf folder (load_dataset reads every
        # data file in it: a named pipe there would hang); a Hub name is no path here
        if not section.dataset:
            return []
        return [("input.dataset", Path(section.dataset), "folder or parquet file")]

    def _source(self) -> str:
        """What to hand load_dataset: a local dataset repository folder (relative: the
        config file's) when there is one, else the Hub name as written."""
        name = self.section.dataset
        if not name:
            raise InputError(
                "must be set for input.format 'hub': give it in the config file or with "
                "--set input.dataset=...",
                field="input.dataset",
            )
        local = self.resolve(Path(name))
        return str(local) if local is not None and local.is_dir() else name

    def sources(self) -> list[Path]:
        source = self._source()
        return [Path(source)] if Path(source).is_dir() else []

    def _configs(self) -> list[str | None]:
        return list(self.section.configs) or [None]

    def _label(self, config: str | None) -> str:
        parts = [p for p in (config, self.section.split) if p]
        return f"{self.section.dataset} [{'/'.join(parts)}]" if parts else str(self.section.dataset)

    def _download_hint(self) -> str:
        c = self.section
        cfgs = ", ".join(repr(x) for x in self._configs())
        split = f", split={c.split!r}" if c.split else ""
        return (
            'on a machine with network run: python -c "import datasets; '
            f'[datasets.load_dataset({c.dataset!r}, c{split}) for c in ({cfgs},)]" '
            "then copy that machine's datasets cache folder (HF_DATASETS_CACHE, default "
            "~/.cache/huggingface/datasets) here and point HF_DATASETS_CACHE or "
            "input.cache_dir at it, or point input.dataset at a local copy of the repository"
        )

    def _load(self, config: str | None) -> Any:
        import datasets

        c = self.section
        where = self._label(config)
        cache_dir = self.resolve(c.cache_dir)
        source = self._source()
        local = Path(source).is_dir()
        if local:
            cache_dir = _local_cache(Path(source), cache_dir)
        # the Hub out of reach: read the cached copy, or fail at once (_load_error says so)
        hub_down = not local and not _offline() and not _hub_reachable()
        # datasets' progress bars and notes ("Using the latest cached version...") would
        # break into prb's own lines; its errors still come back as exceptions
        bars = datasets.utils.logging.is_progress_bar_enabled()
        verbosity = datasets.utils.logging.get_verbosity()
        datasets.disable_progress_bars()
        datasets.utils.logging.set_verbosity_error()
        try:
            with _offline_mode() if hub_down else contextlib.nullcontext():
                ds = datasets.load_dataset(
                    source,
                    config,
                    split=c.split,
                    revision=c.revision,
                    cache_dir=str(cache_dir) if cache_dir is not None else None,
                )
        except InputError:
            raise
        except Exception as exc:  # ConnectionError, ValueError, FileNotFoundError...
            raise self._load_error(exc, config, where) from None
        finally:
            datasets.utils.logging.set_verbosity(verbosity)
            if bars:
                datasets.enable_progress_bars()
        return _pick_split(ds, c.split, where)

    def _load_error(self, exc: Exception, config: str | None, where: str) -> InputError:
        import datasets

        text = " ".join(str(exc).split()).rstrip(".")
        if config is not None and ("BuilderConfig" in text or "not found. Available" in text):
            return InputError(
                f"config {config!r} not found ({text}); fix input.configs",
                path=where,
                field="configs",
            )
        if "Unknown split" in text or "Bad split" in text:
            return InputError(f"{text}; fix input.split", path=where, field="split")
        offline = _offline()
        unreachable = isinstance(exc, ConnectionError | OSError) or "offline" in text.lower()
        if offline or unreachable:
            why = (
                "offline mode is on (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)"
                if offline
                else "the Hub cannot be reached"
            )
            cache = self.resolve(self.section.cache_dir) or datasets.config.HF_DATASETS_CACHE
            return InputError(
                f"the dataset is not in the local datasets cache ({cache}) and {why}; "
                + self._download_hint(),
                path=where,
            )
        if isinstance(exc, datasets.exceptions.DatasetNotFoundError):
            return InputError(
                f"dataset not found ({text}); check input.dataset", path=where, field="dataset"
            )
        return InputError(f"cannot load the dataset: {text}", path=where)

    def count(self) -> int:
        return sum(len(self._load(config)) for config in self._configs())

    def read(self) -> Iterator[dict]:
        ids = Unique("id")
        columns = _Columns(self.section.columns, self._label(None))
        for config in self._configs():
            where = self._label(config)
            columns.where = where
            n = 0
            rows = _dataset_rows(self._load(config), columns.wanted)
            for n, rec in enumerate(rows, start=1):
                yield columns.example(rec, Loc(where, n, unit="row"), ids, config)
            if n == 0:
                raise InputError(
                    "the dataset holds no rows; check input.configs and input.split", path=where
                )
