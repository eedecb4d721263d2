#!/usr/bin/env python3
"""Every name a README puts in backticks as code exists where that README points, and
every section a comment, message or page cites by title exists.

A rename leaves a README pointing at nothing; this test makes that a failure. For each
README.md (the top one, each stage's, docs/README.md) and each reference page of docs/ (the
dated pages are measurements of their day and keep that day's names), the backticked tokens
that read as code are checked:
  - a path of this tree (`common/reception.hpp`, `tests/data/p5.xml`, `common/endpoint`, a
    program such as `tests/provider/shm_faults`): it, or its source, exists from the page's
    folder or the top; a bare file name (`main.cpp`) exists somewhere in the tree;
  - a name (`PostWrites`, `common::Departures`, `Cluster.P5DressRehearsal`, `Peer::Leave`):
    it occurs as a word in the files the page is about. A stage's README is about its own
    folder, the stage before it (a step's README names what the step changed), and the files
    and folders it names or links; the top README and docs/ are about the whole tree.
libfabric's names (fi_*, FI_*) and paths (prov/...), sysfs paths, what the scripts write
(results/...), options (--x), commands and prose are not checked.
Usage: readme_names_test.py SOURCE_ROOT. Prints each stale name with where it was found
instead, if anywhere; exits 1 if any.
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1]).resolve()
SOURCES = {".cpp", ".hpp", ".h", ".cu", ".py", ".sh", ".build", ".txt", ".json", ".yaml", ""}
# A code name: a capitalised word (Worker, PostWrites, ServerMain), a qualified name
# (common::Departures, Peer::Leave), a call (Dispatch()), or a gtest name (Suite.Test).
CAMEL = re.compile(r"^[A-Z][a-z0-9]+([A-Z][A-Za-z0-9]*)?$")
QUALIFIED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(::[A-Za-z_~][A-Za-z0-9_]*)+$")
CALL = re.compile(r"^([A-Za-z_][A-Za-z0-9_:]*)\(\)$")
GTEST = re.compile(r"^([A-Z][A-Za-z0-9]+)\.([A-Z][A-Za-z0-9]+)$")
PATH = re.compile(r"^[A-Za-z0-9_.\-/]+\.(cpp|hpp|md|xml|py|sh|json|build|svg|csv|yaml)$|^[a-z0-9_]+/[A-Za-z0-9_./\-]*$")


def files_under(path):
    if path.is_file():
        return [path]
    if path.is_dir():
        return [p for p in path.rglob("*") if p.is_file() and p.suffix in SOURCES
                and "build" not in p.relative_to(root).parts[0]]
    return []


def exists(token, page):
    if "/" not in token:  # a bare file name: somewhere in the tree
        return any(True for p in root.rglob(token) if "build" not in p.relative_to(root).parts[0])
    for base in (page.parent, root):
        for candidate in (token, token + ".cpp", token + ".hpp", token + ".sh"):
            if (base / candidate).exists():
                return True
    return False


def ours(token, page):
    """Whether a path-like token names a place in this tree (not libfabric's, sysfs, output)."""
    if "/" not in token:
        return True
    first = token.split("/")[0]
    if first in ("prov", "include", "src", "fabtests", "results", "build"):
        return False  # libfabric's tree, or what the scripts and meson write
    if re.search(r"\.(cpp|hpp|py|sh|md|xml)$", token):
        return True
    return any((base / first).exists() for base in (page.parent, root)) and first not in ("results", "build")


def words_in(files):
    text = ""
    for f in files:
        try:
            text += f.read_text(errors="replace") + "\n"
        except OSError:
            pass
    return text


def found(name, text):
    return re.search(r"(?<![A-Za-z0-9_])" + re.escape(name) + r"(?![A-Za-z0-9_])", text) is not None


pages = [root / "README.md", root / "docs" / "README.md"]
pages += sorted(root.glob("0*/README.md"))
pages += [p for p in sorted((root / "docs").glob("*.md"))
          if not re.match(r"\d{4}-\d{2}-\d{2}-", p.name) and p.name != "README.md"]
everything = words_in(files_under(root / "common") + files_under(root / "tests") +
                      files_under(root / "scripts") +
                      [f for d in root.glob("0*") for f in files_under(d)])
stale = []
checked = 0
for page in pages:
    text = page.read_text()
    tokens = re.findall(r"`([^`\n]+)`", text)
    # The files it is about: the whole tree for the top README and docs/; a stage's folder, the
    # stage before it, and every path it names or links.
    stage = re.match(r"0(\d)_", page.parent.name)
    about = []
    if not stage:
        about = None
    else:
        about = [f for f in page.parent.iterdir() if f.is_file() and f.suffix in SOURCES]
        for before in root.glob("0%d_*" % (int(stage.group(1)) - 1)):
            about += files_under(before)
    named = [t for t in tokens if PATH.match(t)] + re.findall(r"\]\(([^)#\s]+)", text)
    for n in named:
        for base in (page.parent, root):
            if about is not None and (base / n).exists():
                about += files_under((base / n).resolve())
                break
    about_text = everything if about is None else words_in(about)
    for t in tokens:
        t = t.strip()
        if PATH.match(t):
            if not ours(t, page):
                continue
            checked += 1
            if not exists(t, page):
                stale.append((page, t, "no such file"))
            continue
        m = CALL.match(t)
        name = m.group(1) if m else t
        g = GTEST.match(name)
        if g:  # a test: Suite.Name, defined as TEST(Suite, Name) or TEST_P(Suite, Name)
            checked += 1
            if not found(g.group(2), words_in(files_under(root / "tests"))):
                stale.append((page, t, "no such test"))
            continue
        if not (CAMEL.match(name) or QUALIFIED.match(name) or m):
            continue
        if name.startswith(("fi_", "FI_", "std::", "CLI::", "cuda", "hwloc")):
            continue
        checked += 1
        parts = name.split("::")
        where = about_text
        if parts[0] == "common":
            where += words_in(files_under(root / "common"))
            parts = parts[1:]
        if all(found(p, where) for p in parts if p):
            continue
        elsewhere = "elsewhere in the sources" if all(found(p, everything) for p in parts) else "nowhere"
        stale.append((page, t, "not in the files it is about; " + elsewhere))

# A section cited by its title, anywhere in the sources or pages (`README.md, "The files"`,
# `docs/failure-modes.md, "When a NIC fails"`): a page of that name has a heading or a bold
# lead of that title.
cited = 0
for f in files_under(root / "common") + files_under(root / "tests") + files_under(root / "scripts") + \
        [f for d in root.glob("0*") for f in files_under(d)] + pages + \
        sorted((root / "docs").glob("*.md")):
    for name, title in re.findall(r"([A-Za-z0-9_.\-/]*\.md),\s+\"([^\"]+)\"", f.read_text(errors="replace")):
        title = " ".join(re.sub(r"\n\s*(//|#)?", " ", title).split())  # wrapped in a comment
        if not title.strip():
            continue  # a C++ string literal split after its opening quote
        cited += 1
        targets = [p for p in root.rglob(pathlib.Path(name).name)
                   if "build" not in p.relative_to(root).parts[0]]
        pattern = r"\s+".join(re.escape(w) for w in title.split())  # a heading may wrap too
        heading = re.compile(r"^#+ .*" + pattern + r"|\*\*" + pattern, re.M)
        if not any(heading.search(t.read_text(errors="replace")) for t in targets):
            stale.append((f, f'{name}, "{title}"', "no such section"))

for page, token, why in stale:
    print(f"STALE: {page.relative_to(root)}: `{token}`: {why}")
print(f"readme names: {checked} checked in {len(pages)} pages, {cited} cited sections; "
      f"{len(stale)} stale")
sys.exit(1 if stale else 0)
