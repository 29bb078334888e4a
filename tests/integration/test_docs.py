"""The documentation a user clones (issue 24 §13): the README is a front page that fits in a
screenful of scrolling, and every link in it and in docs/ (and deploy/) resolves inside the
repository — to a file that exists and, with a #fragment, to a heading of that file. Nothing
points outside the repository's tree (../shared/ is not cloned with it)."""

import glob
import os
import re

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)")


def pages():
    out = [os.path.join(ROOT, "README.md")]
    out += sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    out += sorted(glob.glob(os.path.join(ROOT, "deploy", "**", "*.md"), recursive=True))
    out += sorted(glob.glob(os.path.join(ROOT, "clients", "*", "README.md")))
    return out


def prose(path):
    """The file without its fenced code blocks (a link in code is not a link)."""
    out, fenced = [], False
    for line in open(path, encoding="utf-8").read().split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    s = heading.strip().lower()
    s = re.sub(r"[`*_]", "", s)
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path):
    seen, out = {}, set()
    for line in prose(path):
        m = re.match(r"^(#{1,6})\s+(.*)$", line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def test_every_link_resolves_inside_the_repository():
    bad = []
    for page in pages():
        for line in prose(page):
            for text, target in LINK.findall(line):
                if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                    continue
                path, _, frag = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path \
                    else page
                rel = os.path.relpath(page, ROOT)
                if not dest.startswith(ROOT + os.sep):
                    bad.append(f"{rel}: [{text}]({target}) leaves the repository")
                elif not os.path.exists(dest):
                    bad.append(f"{rel}: [{text}]({target}) names no file")
                elif frag and dest.endswith(".md") and frag not in anchors(dest):
                    bad.append(f"{rel}: [{text}]({target}) names no heading of "
                               f"{os.path.relpath(dest, ROOT)}")
    assert not bad, "\n".join(bad)


def test_the_readme_is_a_front_page():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    lines = text.count("\n")
    assert lines <= 300, f"README.md has {lines} lines: the rest belongs in docs/"
    assert "../shared" not in text
    assert "make run" in text and "make test" in text
    for page in ("docs/api.md", "docs/configuration.md", "docs/operations.md", "docs/design.md",
                 "docs/testing.md", "docs/measured.md", "docs/clients.md"):
        assert f"]({page})" in text, f"the README does not link {page}"
