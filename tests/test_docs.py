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
