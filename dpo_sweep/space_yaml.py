"""A space file's YAML read with limits: a file too big to be a space file, YAML aliases that
expand to more values than a space file holds (a "billion laughs" file), aliases that refer to
the value holding them and a key given twice in one mapping (YAML keeps the last silently) are
refused in milliseconds, before any value is built or validated. :func:`check_values` refuses
the values no setting takes: NaN, infinities and integers past 64 bits."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from dpo_sweep.errors import SpaceError
from dpo_sweep.text import excerpt


#: A space file is a few kilobytes; anything near this is no space file (and would take long to parse).
MAX_SPACE_BYTES = 1_000_000
#: Values (scalars, lists, mappings) a space file may hold once its YAML aliases are expanded: a
#: few aliases that refer to each other (a "billion laughs" file) expand to billions of values,
#: which validation would walk for minutes and gigabytes.
MAX_YAML_NODES = 100_000
#: The largest integer a setting may hold (a seed reaches torch.manual_seed, which takes 64 bits).
MAX_INT = 2**63 - 1


def _duplicate_key(node: yaml.MappingNode) -> str | None:
    """``line 7: 'micro_batch' is given twice in one mapping (first on line 5)`` or None."""
    seen: dict[Any, int] = {}
    for key, _ in node.value:
        if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
            continue
        if key.value in seen:
            return (f"line {key.start_mark.line + 1}: key {excerpt(key.value, 80)!r} is given twice in one mapping "
                    f"(first on line {seen[key.value]}); YAML would keep the last silently: keep one")
        seen[key.value] = key.start_mark.line + 1
    return None


def _expanded_nodes(node: yaml.Node, sizes: dict[int, int], open_: set[int], twice: list[str]) -> int:
    """The values under ``node`` with every alias expanded (capped just past MAX_YAML_NODES);
    ``twice`` gets the keys given twice in one mapping (:func:`_duplicate_key`)."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_:
        raise SpaceError("an alias refers to the value that holds it (a YAML structure that never ends)")
    open_.add(key)
    total = 1
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        if (duplicate := _duplicate_key(node)) is not None:
            twice.append(duplicate)
        children = [n for pair in node.value for n in pair]
    else:
        children = []
    for child in children:
        total += _expanded_nodes(child, sizes, open_, twice)
        if total > MAX_YAML_NODES:
            break
    open_.discard(key)
    sizes[key] = total
    return total


def safe_yaml(text: str, source: str) -> Any:
    """``yaml.safe_load(text)``, refusing (SpaceError) what would expand past MAX_YAML_NODES
    values: the aliases are counted on the composed document, before any value is built."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        twice: list[str] = []
        try:
            count = _expanded_nodes(node, {}, set(), twice)
        except SpaceError as err:
            raise SpaceError(f"{source}: {err}") from None
        if count > MAX_YAML_NODES:
            raise SpaceError(f"{source}: its YAML aliases (*name) expand to more than {MAX_YAML_NODES:,} values; "
                             "a space file holds a few dozen: write the values out, or use fewer aliases")
        if twice:
            raise SpaceError(f"{source}: {twice[0]}")
        return loader.construct_document(node)
    except yaml.YAMLError as err:
        raise SpaceError(f"{source}: not valid YAML: {excerpt(str(err), 400)}") from None
    finally:
        loader.dispose()


def load_raw(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        spaces = sorted(q.name for q in p.glob("*.yaml"))[:3]
        hint = f" (it holds {', '.join(spaces)})" if spaces else ""
        raise SpaceError(f"{path}: this is a directory, not a space file; give a YAML file{hint}, "
                         "e.g. search_spaces/quickstart.yaml")
    if p.exists() and not p.is_file():
        raise SpaceError(f"{path}: not a regular file (a pipe, device or socket); give a YAML space file, "
                         "e.g. search_spaces/quickstart.yaml")
    if not p.is_file():
        raise SpaceError(f"{path}: no such space file")
    size = p.stat().st_size
    if size > MAX_SPACE_BYTES:
        raise SpaceError(f"{path}: {size:,} bytes; a space file is a few kilobytes (at most {MAX_SPACE_BYTES:,} "
                         "bytes): is this the data file? Name the data in data.path instead")
    try:
        text = p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise SpaceError(f"{path}: not UTF-8 text (byte {err.start}); save it as UTF-8") from None
    raw = safe_yaml(text, str(path))
    if not isinstance(raw, dict):
        raise SpaceError(f"{path}: a space file is a mapping with name, model, data, train, search")
    return raw




def _bad_value(value: Any) -> str | None:
    """What is wrong with a scalar no setting takes, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not allowed; give a finite number"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        return (f"{excerpt(str(value), 40)} ({len(str(abs(value)))} digits) is out of range; give an integer "
                f"of at most {MAX_INT:,} (64 bits)")
    return None


def check_values(data: Any, source: str, path: str = "") -> None:
    """SpaceError naming the first NaN, infinity or over-64-bit integer under ``data`` by its
    dotted path (``search.beta[0]: nan is not allowed; give a finite number``)."""
    if isinstance(data, dict):
        for key, value in data.items():
            check_values(value, source, f"{path}.{key}" if path else str(key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            check_values(value, source, f"{path}[{i}]")
    elif (why := _bad_value(data)) is not None:
        raise SpaceError(f"{source}: {path}: {why}")
