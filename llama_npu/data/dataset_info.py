"""The data a run reads, as inputs: data.train_files (one input, data.format, data.columns,
data.tags), or the entries of a LLaMA-Factory dataset_info.json that data.dataset names in
data.dataset_dir, each read as LLaMA-Factory reads it (src/llamafactory/data/parser.py
DatasetAttr, loader.py _load_single_dataset, hparams/data_args.py split_arg):

- file_name, relative to the folder: a file, or a folder whose files share one type;
- formatting: alpaca (the default), sharegpt, or openai (the sharegpt layout with role and
  content turns, LLaMA-Factory's data/README.md; its converter's "detailed thinking off"
  system text, written for one model's template, is not added);
- columns and tags: without them parser.py's defaults (prompt=instruction, query=input,
  response=output, messages=conversations; tags from each turn's keys, data/turn_tags.py);
  an object leaves every name it omits unset: only the columns it names are read;
- ranking: must match the objective (preference pairs need it, the others refuse it);
- num_samples: that many records drawn at random (train.seed), repeating some when the file
  has fewer, as loader.py draws them; data.max_samples then keeps the first N of each;
- split: only "train", a local file having no other.
What cannot be read offline (hub and cloud keys, scripts) and multimodal columns are one
line naming the entry and the key. Pure Python: validate reads it.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .errors import RecordError
from .tables import ALIASES, TABLE_SUFFIXES, ReadOptions
from .turn_tags import tag_problems

DATA_CONFIG = "dataset_info.json"
OFFLINE_IMPOSSIBLE = ("hf_hub_url", "ms_hub_url", "om_hub_url", "cloud_file_name", "script_url")
FORMATTINGS = {"alpaca": "alpaca", "sharegpt": "sharegpt", "openai": "sharegpt"}  # -> our data.format
# parser.py's column names, in its order; and what an entry without `columns` reads
COLUMN_NAMES = ("prompt", "query", "response", "history", "messages", "system", "tools", "images", "videos",
                "audios", "chosen", "rejected", "kto_tag")
MEDIA = ("images", "videos", "audios")
DEFAULT_COLUMNS = {"prompt": "instruction", "query": "input", "response": "output", "messages": "conversations"}
# The file types the readers take; .json and .jsonl are one type, as in LLaMA-Factory's FILEEXT2TYPE
FILE_TYPES = {".json": "json", ".jsonl": "json", **{suffix: suffix[1:] for suffix in TABLE_SUFFIXES}}


@dataclass(frozen=True)
class DataInput:
    """One data set: its files, read alike."""
    name: str  # the dataset_info.json entry, or "" for data.train_files / eval_files
    files: Tuple[str, ...]
    format: str  # alpaca | sharegpt | text
    options: ReadOptions
    num_samples: Optional[int] = None

    def describe(self) -> str:
        return f"{self.name} ({', '.join(self.files)})" if self.name else ", ".join(self.files)


def split_names(names: List[str]) -> List[str]:
    """data.dataset's names, each comma-separated string split and stripped (split_arg)."""
    return [name.strip() for item in names for name in item.split(",")]


def multimodal(where: str, key: str) -> str:
    return f"{where}.{key}: {key} columns are multimodal data, which llama-npu does not train (text only)"


def column_problems(columns: Dict[str, object], known, where: str) -> List[str]:
    """One line a column name that is not one of `known` (a multimodal one says so)."""
    problems = []
    for key in columns:
        if key in MEDIA:
            problems.append(multimodal(where, key))
        elif key not in known:
            problems.append(f"{where}.{key}: unknown column key; expected one of {', '.join(known)}")
    return problems


def recipe_column_keys(read_keys) -> List[str]:
    """data.columns' keys for a format and objective: the keys its records read, and
    LLaMA-Factory's names for them."""
    return sorted(set(read_keys) | {alias for alias, key in ALIASES.items() if key in read_keys})


def _kind(path: Path) -> str:
    """"file", "dir" or "" (absent, or a name no file can have: a NUL byte)."""
    try:
        return "file" if path.is_file() else "dir" if path.is_dir() else ""
    except (OSError, ValueError):
        return ""


def load_info(dataset_dir: str) -> dict:
    path = Path(dataset_dir) / DATA_CONFIG
    if _kind(path) != "file":
        raise RecordError(f"data.dataset_dir={dataset_dir}: no {DATA_CONFIG} in it")
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, OSError) as exc:
        raise RecordError(f"{path}: not a JSON object of dataset entries ({exc})") from None
    if not isinstance(info, dict) or not all(isinstance(entry, dict) for entry in info.values()):
        raise RecordError(f"{path}: expected a JSON object of dataset entries, each an object")
    return info


def entry_files(dataset_dir: str, name: str, file_name: object) -> Tuple[str, ...]:
    """The files of an entry's file_name: the file, or the files of the folder (loader.py)."""
    where = f"{DATA_CONFIG} entry '{name}'"
    if not isinstance(file_name, str) or not file_name:
        raise RecordError(f"{where}: no file_name (a file or folder in {dataset_dir}); llama-npu reads local files only")
    path = Path(dataset_dir) / file_name
    if _kind(path) == "dir":
        files = sorted(str(p) for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    elif _kind(path) == "file":
        files = [str(path)]
    else:
        raise RecordError(f"{where}: file_name {file_name}: {path} not found")
    types = {FILE_TYPES.get(Path(f).suffix.lower()) for f in files}
    if not files or None in types:
        raise RecordError(f"{where}: file_name {file_name}: expected {', '.join(FILE_TYPES)} files, got "
                          f"{', '.join(sorted({Path(f).suffix or Path(f).name for f in files})) or 'an empty folder'}")
    if len(types) > 1:
        raise RecordError(f"{where}: file_name {file_name}: its files are of {len(types)} types "
                          f"({', '.join(sorted(types))}); a folder's files must share one")
    return tuple(files)


def entry_problems(name: str, entry: dict, ranking: bool) -> List[str]:
    """What an entry asks that cannot be honoured here, one line each."""
    where = f"{DATA_CONFIG} entry '{name}'"
    problems = [f"{where}: {key} names data to download, which llama-npu does not read (offline, local files "
                f"only); download it and name the file with file_name" for key in OFFLINE_IMPOSSIBLE if key in entry]
    formatting = entry.get("formatting", "alpaca")
    if formatting not in FORMATTINGS:
        problems.append(f"{where}: formatting {formatting!r}; expected one of {', '.join(FORMATTINGS)}")
    if entry.get("split", "train") != "train":
        problems.append(f"{where}: split {entry['split']!r}; a local file has only the train split: remove the key")
    samples = entry.get("num_samples")
    if samples is not None and not (isinstance(samples, int) and not isinstance(samples, bool) and samples > 0):
        problems.append(f"{where}: num_samples {samples!r}; expected a positive integer")
    if bool(entry.get("ranking", False)) != ranking:
        problems.append(f"{where}: ranking: true is preference pairs, which train with train.objective: dpo" if not
                        ranking else f"{where}: no ranking: true; train.objective: dpo trains on ranking entries "
                                     f"(preference pairs)")
    columns, tags = entry.get("columns", {}), entry.get("tags", {})
    if not isinstance(columns, dict) or not isinstance(tags, dict):
        return problems + [f"{where}: columns and tags must be JSON objects"]
    problems += column_problems(columns, [c for c in COLUMN_NAMES if c not in MEDIA], f"{where}: columns")
    return problems + tag_problems(tags, f"{where}: tags")


def entry_input(dataset_dir: str, name: str, entry: dict, d) -> DataInput:
    """The entry as an input (its problems already refused by check_datasets)."""
    columns = entry.get("columns", DEFAULT_COLUMNS)
    options = ReadOptions.of({key: column for key, column in columns.items() if column}, d.encoding,
                             entry.get("tags", {}), d.label_values, exclusive=True)
    return DataInput(name, entry_files(dataset_dir, name, entry.get("file_name")),
                     FORMATTINGS[entry.get("formatting", "alpaca")], options, entry.get("num_samples"))


def named_inputs(d, names: List[str]) -> List[DataInput]:
    info = load_info(d.dataset_dir)
    unknown = [name for name in split_names(names) if name not in info]
    if unknown:
        local = [name for name, entry in info.items() if "file_name" in entry and
                 not any(key in entry for key in OFFLINE_IMPOSSIBLE)]
        raise RecordError(f"data.dataset: no entry {unknown[0]!r} in {Path(d.dataset_dir) / DATA_CONFIG}; its "
                          f"entries with a local file_name: {', '.join(local) or 'none'}")
    return [entry_input(d.dataset_dir, name, info[name], d) for name in split_names(names)]


def files_input(d, files) -> DataInput:
    """Files named in the recipe, read by its data.format, columns, tags and encoding."""
    return DataInput("", tuple(map(str, files)), d.format, ReadOptions.of_data(d))


def train_inputs(recipe) -> List[DataInput]:
    """What the run trains on: data.dataset's entries, or data.train_files."""
    d = recipe.data
    return named_inputs(d, d.dataset) if d.dataset else [files_input(d, d.train_files)]


def eval_inputs(recipe) -> List[DataInput]:
    """What the run evaluates on: data.eval_dataset's entries, or data.eval_files ([] without)."""
    d = recipe.data
    if d.eval_dataset:
        return named_inputs(d, d.eval_dataset)
    return [files_input(d, d.eval_files)] if d.eval_files else []


def sampled(records: list, data_input: DataInput, max_samples: Optional[int], seed: int) -> list:
    """An input's records after its num_samples (drawn with `seed`) and data.max_samples."""
    n = data_input.num_samples
    if n is not None and records:
        rng = random.Random(seed)
        picked = rng.sample(range(len(records)), min(n, len(records)))
        picked += [rng.randrange(len(records)) for _ in range(n - len(picked))]
        records = [records[i] for i in picked]
    return records[:max_samples] if max_samples is not None else records
