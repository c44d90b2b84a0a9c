"""CI runs exactly the README's test command.

The README's python blocks run in ``tests/docs/test_docs_code.py``, with the pages of docs/.
"""

import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_readme_opens_with_the_two_setup_commands():
    first_block = re.search(r"```bash\n(.*?)```", README, re.S).group(1).strip().splitlines()
    assert len(first_block) == 2
    demo, tests = first_block
    assert demo.startswith("python3 -m venv .venv") and demo.endswith("python -m tdfunc.demo")
    assert "-c constraints.txt" in demo and "-c constraints.txt" in tests
    assert tests.endswith("python -m pytest -q")


def test_ci_runs_the_readme_test_command():
    script = (ROOT / ".ci" / "run").read_text()
    extracted = subprocess.run(
        ["bash", "-c", "awk '/^```bash/{getline; getline; print; exit}' README.md"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    first_block = re.search(r"```bash\n(.*?)```", README, re.S).group(1).strip().splitlines()
    assert extracted == first_block[1]
    assert "awk '/^```bash/{getline; getline; print; exit}' README.md" in script


def _nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [page for value in node.values() for page in _nav_pages(value)]
    return [page for item in node for page in _nav_pages(item)]


def test_readme_links_every_docs_page_and_the_hosted_site():
    yaml = __import__("yaml")
    # mkdocs.yml may hold python tags (!!python/name:...); only the nav is read here.
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    pages = _nav_pages(config["nav"])
    assert len(pages) > 20, pages
    missing = [page for page in pages if f"(docs/{page})" not in README]
    assert not missing, f"docs pages the README does not link: {missing}"
    assert config["site_url"] == "https://tdfunc.github.io/tdfunc/"
    assert config["site_url"] in README
    workflow = (ROOT / ".github" / "workflows" / "docs.yml").read_text()
    assert "mkdocs build --strict" in workflow and "actions/deploy-pages" in workflow
