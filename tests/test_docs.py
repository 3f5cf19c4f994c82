"""The generated YAML reference is current, and the hand-written docs point at things that exist."""

from __future__ import annotations

import re
from pathlib import Path

from experiments.docs_gen import generate

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"


def test_yaml_reference_is_current():
    committed = (DOCS / "yaml-reference.md").read_text()
    assert committed == generate(), "docs/yaml-reference.md is stale: run `servesim docs --out docs/`"


def test_reference_covers_every_policy_and_workload_model():
    text = generate()
    for section in ("## Experiment", "(name: static)", "(name: continuous)", "(name: chunked_prefill)",
                    "## WorkloadSpec", "(kind: poisson)", "(kind: lognormal)", "## PrefixSpec", "## SessionSpec"):
        assert section in text, section
    assert "| `chunk_size` | integer (>= 1) | `512` |" in text


def test_hand_written_docs_exist_and_link_to_real_files():
    for name in ("policies.md", "cost-models.md", "gallery.md"):
        text = (DOCS / name).read_text()
        assert len(text) > 500, name
        for target in re.findall(r"\]\(([^)#:]+)\)", text):
            assert (DOCS / target).exists(), f"{name} links to missing {target}"


def test_gallery_names_every_example():
    gallery = (DOCS / "gallery.md").read_text()
    for example in sorted((ROOT / "experiments" / "examples").glob("*.yaml")):
        assert f"experiments/examples/{example.name}" in gallery, example.name


def test_the_writing_a_policy_example_runs():
    """docs/policies.md's worked example, as written: the policy, then the run that checks it."""
    text = (DOCS / "policies.md").read_text()
    section = text[text.index("## Writing a policy"):text.index("## Reading the results")]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 2
    namespace: dict = {"__name__": "docs_example"}
    for block in blocks:
        exec(compile(block, "docs/policies.md", "exec"), namespace)  # noqa: S102 - our own docs
    from policies.accelerate import DecodeRuns, accelerator_for

    policy = namespace["policy"]
    assert type(accelerator_for(policy)) is DecodeRuns
    assert namespace["accelerated"].num_events < namespace["stepped"].num_events


def test_kv_cache_doc_explains_what_the_tests_check_and_nothing_cites_a_missing_chapter():
    text = (DOCS / "kv-cache.md").read_text()
    for number in ("**24 bytes**", "**32 bytes**", "1280, 1536, 1792 and 2048 bytes", "**1.0 GiB**", "**0.25 GiB**",
                   "**0.125 GiB**", "8 + 20 + 5 = **33 ms**", "(180 - 100) / (5 - 1) = **20 ms**"):
        assert number in text
    # Links into kv-cache.md name headings it has (GitHub's anchors: lower case, spaces to dashes).
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE)}
    pages = [*DOCS.glob("*.md"), ROOT / "README.md"]
    for page in pages:
        body = page.read_text()
        for anchor in re.findall(r"kv-cache\.md#([\w-]+)", body):
            assert anchor in anchors, f"{page.name} links to missing kv-cache.md#{anchor}"
        assert not re.search(r"seed (eq\. )?21\.|eq\. 21\.|chapter", body, flags=re.IGNORECASE), page.name
