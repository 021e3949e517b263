"""mkdocs hook: the files under bench/ that the pages link to (results JSON and PNG,
bench/README.md) are copied into the site under bench/, and the pages' links to them
(`../bench/...`, which leave docs/) point at the copies, so that the built site has no dead
link. bench/README.md becomes a page of its own, outside the nav."""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(\.\./(bench/[^)\s#]+)")


def _linked(docs_dir: Path) -> set[str]:
    targets = {"bench/README.md"}
    for page in docs_dir.glob("*.md"):
        targets |= set(LINK.findall(page.read_text()))
    return {t for t in targets if (ROOT / t).is_file()}


def on_files(files, config):
    for target in sorted(_linked(Path(config["docs_dir"]))):
        files.append(File(target, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files


def on_page_markdown(markdown, page, config, files):
    return LINK.sub(lambda m: "](" + m.group(1), markdown)
