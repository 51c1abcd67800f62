"""docs/fork.md's table of what each common change needs read: every count it gives for named
definitions is their line span in appo.py (or env.py) at this commit, and each change's lines
reached from its entry points are the definitions the code names from them, counted here."""
import ast
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A fork that edits these definitions changes their counts: this file then fails until docs/fork.md
# says the new ones (or the fork drops the page and this test, as a fork of its own).
FORK_EDITED = "fork.md's counts are this repository's: after editing these definitions, mend the page or drop this test"


def definition_spans(path: str) -> dict[str, int]:
    """Lines of each top-level function, class and assignment, and of each method as Class.method."""
    with open(path) as f:
        tree = ast.parse(f.read())
    spans = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            spans[node.name] = node.end_lineno - node.lineno + 1
            for member in node.body if isinstance(node, ast.ClassDef) else []:
                if isinstance(member, ast.FunctionDef):
                    spans[f"{node.name}.{member.name}"] = member.end_lineno - member.lineno + 1
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    spans[target.id] = node.end_lineno - node.lineno + 1
    return spans


def reached(path: str, entry_points: list[str]) -> dict[str, int]:
    """Every definition above appo.py's first PLUMBING header (all of env.py) that the entry points
    name, and that those name, and so on, each with its line span: what a reader of the change
    follows by name. Type annotations do not count (a reader need not open a type to call a
    function), nor methods reached by attribute (`model.encode`): name a method as an entry point."""
    with open(path) as f:
        source = f.read()
    tree = ast.parse(source)
    plumbing = [number for number, line in enumerate(source.splitlines(), 1) if line.startswith("# PLUMBING")]
    end = plumbing[0] if plumbing else len(source.splitlines())
    nodes = {}
    for node in tree.body:
        if node.lineno > end:
            break
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            nodes[node.name] = node
            for member in node.body if isinstance(node, ast.ClassDef) else []:
                if isinstance(member, ast.FunctionDef):
                    nodes[f"{node.name}.{member.name}"] = member
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    nodes[target.id] = node

    def names_in(node) -> set[str]:
        annotations = set()
        for sub in ast.walk(node):
            annotation = (sub.annotation if isinstance(sub, (ast.arg, ast.AnnAssign)) else
                          sub.returns if isinstance(sub, ast.FunctionDef) else None)
            if annotation is not None:
                annotations |= {id(part) for part in ast.walk(annotation)}
        return {sub.id for sub in ast.walk(node) if isinstance(sub, ast.Name) and sub.id in nodes
                and id(sub) not in annotations}

    found, todo = set(), list(entry_points)
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo += names_in(nodes[name]) - found
    whole = {name for name in found if "." not in name or name.split(".")[0] not in found}  # a class counts once
    spans = {}
    for name in whole:
        node = nodes[name]
        first = node.decorator_list[0].lineno if getattr(node, "decorator_list", None) else node.lineno
        spans[name] = node.end_lineno - first + 1
    return spans


def counted_groups(cell: str) -> list[tuple[list[str], int]]:
    """The read cell's groups: the backticked names before each "(N)" (or "(N: ..."), since the last one."""
    groups, start = [], 0
    for match in re.finditer(r"\((\d+)[:)]", cell):
        text = cell[start:match.start()]
        groups.append((re.findall(r"`([^`]+)`", text), int(match.group(1)), text))
        start = match.end()
    return groups


def test_fork_mds_line_counts_are_the_definitions_spans_at_this_commit():
    spans = {**definition_spans(os.path.join(REPO, "env.py")), **definition_spans(os.path.join(REPO, "appo.py"))}
    with open(os.path.join(REPO, "docs", "fork.md")) as f:
        fork = f.read()
    rows = [line.split(" | ") for line in fork.splitlines() if line.startswith("| ") and line.count(" | ") == 3]
    checked = 0
    for change, read, _, _ in rows[1:]:
        for names, count, text in counted_groups(read):
            # a group is the named definitions whole, unless it reads a part of one (its lines, a docstring)
            if not names or any(name not in spans for name in names) or re.search(r"lines of|docstring|flag", text):
                continue
            assert sum(spans[name] for name in names) == count, (FORK_EDITED, change, names, count,
                                                                  {name: spans[name] for name in names})
            checked += 1
    assert checked >= 15  # most of the table's groups are whole definitions


def test_fork_mds_lines_reached_are_counted_from_the_entry_points():
    """The table's last column: for each change, the definitions reached by name from its entry
    points (the third column), counted whole; printed, so `pytest -s` shows what each one reads."""
    with open(os.path.join(REPO, "docs", "fork.md")) as f:
        fork = f.read()
    rows = [line.strip("| ").split(" | ") for line in fork.splitlines() if line.startswith("| ") and line.count(" | ") == 3]
    assert rows[0] == ["change", "read", "entry points", "lines reached"]
    checked = 0
    for change, _, entries, lines in rows[1:]:
        entry_points = re.findall(r"`([^`]+)`", entries)
        if not entry_points:  # a change that edits a table, not code
            continue
        path = os.path.join(REPO, "env.py" if entries.startswith("env.py") else "appo.py")
        spans = reached(path, entry_points)
        listed = ", ".join(f"{name} {span}" for name, span in sorted(spans.items()))
        print(f"{change}: {sum(spans.values())} lines: {listed}")
        assert lines == str(sum(spans.values())), (FORK_EDITED, change, sum(spans.values()), spans)
        checked += 1
    assert checked == 6


def test_reached_follows_names_not_annotations(tmp_path):
    """What the count follows, on a file written here: a name in a body is followed (and what it
    names in turn), an annotation is not, nor anything below the first PLUMBING header."""
    source = tmp_path / "shape.py"
    source.write_text("""
class Big:
    def method(self):
        return 1


def helper(x):
    return x + CONSTANT


CONSTANT = 2


def entry(x: Big) -> Big:
    return helper(x)


def unrelated():
    return entry(1)
# PLUMBING
def below():
    return 0
""")
    assert reached(str(source), ["entry"]) == {"entry": 2, "helper": 2, "CONSTANT": 1}
    assert reached(str(source), ["unrelated"]) == {"unrelated": 2, "entry": 2, "helper": 2, "CONSTANT": 1}
    assert reached(str(source), ["Big.method"]) == {"Big.method": 2}
    assert reached(str(source), ["Big", "Big.method"]) == {"Big": 3}
