#!/bin/sh
# The guide's shape and links: README.md is a front page of at most 300
# lines; every relative link and image of README.md and docs/*.md names a
# file that exists, and every #anchor a heading of its page (GitHub's
# anchors: lower case, punctuation dropped, spaces as dashes, -1, -2 after
# a repeated heading). Links inside code (indented or fenced blocks, `spans`)
# are text, not links.
. "$(dirname "$0")/lib.sh"
n=$(wc -l < "$srcdir/README.md")
[ "$n" -le 300 ] && ok "README.md is $n lines" || fail "README.md is $n lines, over the front page's 300"
"$PYTHON" - "$srcdir" << 'PY' || fail "broken links (above)"
import glob, os, re, sys
src = sys.argv[1]
pages = [os.path.join(src, "README.md")] + sorted(glob.glob(os.path.join(src, "docs", "*.md")))

def prose(path):
    """The page's lines outside code blocks, inline code removed."""
    out, fenced, prev_blank, in_block = [], False, True, False
    for line in open(path, encoding="utf-8").read().split("\n"):
        if line.startswith("```"):
            fenced = not fenced
            out.append("")
            continue
        code = line.startswith("    ") and (in_block or prev_blank) and not line.lstrip().startswith(("- ", "* "))
        in_block = code and not fenced
        prev_blank = line.strip() == ""
        out.append("" if fenced or in_block else re.sub(r"`[^`]*`", "", line))
    return out

def anchors(path):
    seen, out = {}, set()
    for line in prose(path):
        m = re.match(r"^#{1,6} +(.*?) *#*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        k = seen.get(slug, 0)
        seen[slug] = k + 1
        out.add(slug if k == 0 else "%s-%d" % (slug, k))
    return out

bad, links = [], 0
cache = {}
for page in pages:
    for no, line in enumerate(prose(page), 1):
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if re.match(r"^[a-z]+:", target):
                continue  # http(s), mailto: not this repository's
            links += 1
            path, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            where = "%s:%d" % (os.path.relpath(page, src), no)
            if not os.path.exists(dest):
                bad.append("%s: %s names no file" % (where, target))
            elif anchor:
                if dest not in cache:
                    cache[dest] = anchors(dest)
                if anchor not in cache[dest]:
                    bad.append("%s: %s: no heading of %s has the anchor #%s" %
                               (where, target, os.path.relpath(dest, src), anchor))
for b in bad:
    print("FAIL: " + b)
print("%s: %d links on %d pages" % ("ok" if not bad else "checked", links, len(pages)))
sys.exit(1 if bad else 0)
PY
finish
