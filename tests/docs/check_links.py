#!/usr/bin/env python3
"""Every relative link and image of README.md and docs/**/*.md resolves to a file or folder of the
repository (issue 29). Web links are not fetched. Usage: check_links.py REPOSITORY_ROOT."""

import os
import re
import sys

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def pages(root):
    yield os.path.join(root, "README.md")
    for directory, _, files in os.walk(os.path.join(root, "docs")):
        for name in sorted(files):
            if name.endswith(".md"):
                yield os.path.join(directory, name)


def main():
    root = os.path.abspath(sys.argv[1])
    broken, checked = [], 0
    for page in pages(root):
        in_fence = False
        for number, line in enumerate(open(page, encoding="utf-8"), start=1):
            if line.lstrip().startswith("```"):
                in_fence = not in_fence
            if in_fence:
                continue
            for target in LINK.findall(line):
                if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                    continue
                path = os.path.normpath(os.path.join(os.path.dirname(page), target.split("#")[0]))
                checked += 1
                if not os.path.exists(path):
                    broken.append(f"{os.path.relpath(page, root)}:{number}: {target} (no {os.path.relpath(path, root)})")
    for b in broken:
        print(b)
    print(f"{checked} links checked, {len(broken)} broken")
    return 1 if broken or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
