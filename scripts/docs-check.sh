#!/usr/bin/env bash
# The user guide builds and its links resolve: `mdbook build docs` (docs/book.toml), then
# every relative link in README.md, docs/, BENCHMARKS.md and fuzz/README.md names a file
# that exists and, with a #fragment into a Markdown file, one of its headings. Links to
# other sites are not fetched (CI has no network to check them with).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v mdbook >/dev/null; then
    echo "docs-check: mdbook is missing; scripts/setup.sh installs it (cargo install mdbook)" >&2
    exit 2
fi
mdbook build docs 2>&1 | grep -v '^\S* \S* \[INFO\]' || true
test -f target/book/index.html || { echo "docs-check: mdbook built no book" >&2; exit 1; }
python3 - README.md docs/*.md BENCHMARKS.md fuzz/README.md <<'PY'
import os, re, sys

def slug(heading):
    # The anchors GitHub and mdBook give a heading: lower case, punctuation dropped,
    # spaces to dashes.
    h = re.sub(r"`|\*|_(?=\w)", "", heading.strip().lower())
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")

def anchors(path):
    found, fence = set(), False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found

bad = 0
for src in sys.argv[1:]:
    text = open(src, encoding="utf-8").read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, frag = target.partition("#")
        full = os.path.normpath(os.path.join(os.path.dirname(src), path)) if path else src
        if not os.path.exists(full):
            print(f"{src}: link to {target}: {full} does not exist")
            bad += 1
        elif frag and full.endswith(".md") and frag not in anchors(full):
            print(f"{src}: link to {target}: no heading #{frag} in {full}")
            bad += 1
if bad:
    sys.exit(f"docs-check: {bad} broken links")
print(f"docs-check: the book builds and every relative link in {len(sys.argv) - 1} files resolves")
PY
