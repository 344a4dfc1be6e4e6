"""The registry is the only list of architectures.

A test that names the architectures it runs for leaves out every folder added after it was written (or fails the
moment one is added). So no test outside an architecture's own folder (tests/models/<arch>/) holds a literal
sequence of two or more architecture names: shared tests iterate `registry.architectures()` and ask an
architecture what it has (a transformers format, a demo, variants, official rows), never a list of names. The same
holds for recurlen's own code outside the architecture folders, where two modules name them by design: the registry
(recurlen/models/registry.py: its listing order) and the model table (recurlen/models/table.py: each row's
architecture).

Checked on the source (AST): a list, tuple, set or dict (keys and values, nested ones and calls inside them, such
as pytest.param) whose string constants hold two or more architecture names, and a string that quotes two or
more of them (an error message's allowed list written out).
"""

import ast
import re
from pathlib import Path

from recurlen.models import registry

ROOT = Path(__file__).resolve().parents[1]
NAMES = frozenset(registry.architectures())


def _strings(node: ast.AST):
    """The string constants of a literal collection: its elements, nested collections' and calls' arguments."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        for element in node.elts:
            yield from _strings(element)
    elif isinstance(node, ast.Dict):
        for element in (*node.keys, *node.values):
            if element is not None:  # {**other}
                yield from _strings(element)
    elif isinstance(node, ast.Call):
        for element in (*node.args, *(k.value for k in node.keywords)):
            yield from _strings(element)
    elif isinstance(node, ast.Starred):
        yield from _strings(node.value)


def name_lists(source: str, names: frozenset[str] = NAMES) -> list[tuple[int, list[str]]]:
    """(line, names) of every literal sequence of two or more of `names` in Python source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict)):
            named = set(_strings(node)) & names
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            named = set(re.findall(r"""['"]([\w.-]+)['"]""", node.value)) & names
        else:
            continue
        if len(named) >= 2:
            found.append((node.lineno, sorted(named)))
    # A collection inside another is reported once, at the outermost (ast.walk visits it first).
    seen, unique = set(), []
    for line, named in found:
        if (line, tuple(named)) not in seen:
            seen.add((line, tuple(named)))
            unique.append((line, named))
    return unique


NAMING = (ROOT / "recurlen" / "models" / "registry.py", ROOT / "recurlen" / "models" / "table.py")
"""The modules that name architectures by design: the registry's order, the model table's rows."""


def _scanned() -> list[Path]:
    """tests/ but each architecture's own folder; recurlen/ and callbacks/ but the architecture folders and NAMING."""
    own = {ROOT / "tests" / "models" / name for name in NAMES} | {ROOT / "recurlen" / "models" / name for name in NAMES}
    files = [*(ROOT / "tests").rglob("*.py"), *(ROOT / "recurlen").rglob("*.py"), *(ROOT / "callbacks").rglob("*.py")]
    return sorted(path for path in files if not any(folder in path.parents for folder in own)
                  and path not in NAMING)


def test_the_scan_finds_each_way_a_list_of_names_is_written():
    a, b = sorted(NAMES)[:2]
    for source in (f"ARCHS = [{a!r}, {b!r}]",
                   f"@pytest.mark.parametrize('arch,title', [({a!r}, 'A'), ({b!r}, 'B')])\ndef test(arch): pass",
                   f"FIELDS = {{{a!r}: {{}}, {b!r}: {{'x': 1}}}}",
                   f"CASES = [pytest.param({a!r}), pytest.param({b!r})]",
                   f"for arch, cls in (({a!r}, 'X'), ({b!r}, 'Y')): pass",
                   f"match = r\"allowed: \\[{a!r}, {b!r}\\]\""):
        assert [named for _, named in name_lists(source)] == [[a, b]], source
    for source in (f"arch = {a!r}", f"if arch == {a!r}: pass", f"nano({a!r}); nano({b!r})",
                   f"x = ['{a}-tiny', '{b}-tiny']"):  # one name at a time; model names are not architecture names
        assert name_lists(source) == [], source


def test_no_test_and_no_code_above_the_architecture_folders_lists_architecture_names():
    assert len(NAMES) >= 2
    scanned = _scanned()
    assert ROOT / "tests" / "conftest.py" in scanned and ROOT / "recurlen" / "commands" / "demo.py" in scanned
    offenders = [f"{path.relative_to(ROOT)}:{line}: {named}"
                 for path in scanned for line, named in name_lists(path.read_text())]
    assert not offenders, ("literal lists of architecture names (iterate registry.architectures() and ask each "
                           "architecture what it has instead):\n" + "\n".join(offenders))
