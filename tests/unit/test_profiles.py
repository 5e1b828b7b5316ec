"""Model profiles: the shipped files load into core values; mistakes are reported by file and field."""

from __future__ import annotations

from pathlib import Path

import jinja2
import pytest

from warmer.config.profiles import load_profile, load_profiles
from warmer.core.errors import ConfigError
from warmer.core.model import EngineKind, MambaStrategy, RestartRecipe

MODELS_DIR = Path(__file__).resolve().parents[2] / "models"


def test_shipped_profiles_load_with_their_facts() -> None:
    profiles = load_profiles(MODELS_DIR)
    assert {
        "tiny-demo",
        "dense-sglang",
        "dense-sglang-paged",
        "dense-vllm",
        "hybrid-sglang-no-buffer",
        "hybrid-sglang-extra-buffer",
        "hybrid-vllm",
        "tiny-vllm-cpu",
    } <= set(profiles)

    tiny = profiles["tiny-demo"]
    assert (tiny.engine, tiny.slots, tiny.block_tokens) == (EngineKind.LLAMACPP, 2, 1)
    assert (tiny.bos_token, tiny.eos_token) == ("<s>", "</s>")
    assert tiny.restart.burst_levels == (1, 2)

    assert (profiles["dense-sglang"].engine, profiles["dense-sglang"].slots) == (EngineKind.SGLANG, 48)
    assert (profiles["dense-vllm"].engine, profiles["dense-vllm"].block_tokens) == (EngineKind.VLLM, 16)
    no_buffer, extra = profiles["hybrid-sglang-no-buffer"], profiles["hybrid-sglang-extra-buffer"]
    assert (no_buffer.running_state, no_buffer.mamba_strategy) == (True, MambaStrategy.NO_BUFFER)
    assert (extra.running_state, extra.mamba_strategy, extra.mamba_chunk_size) == (
        True,
        MambaStrategy.EXTRA_BUFFER,
        64,
    )
    # One bare-prefix warm per round now: the hybrid profiles no longer ask for several.
    assert no_buffer.warm_requests_per_prefix == extra.warm_requests_per_prefix == 1
    assert profiles["hybrid-vllm"].running_state
    assert profiles["dense-sglang-paged"].block_tokens == 1  # the page size comes from the server
    cpu = profiles["tiny-vllm-cpu"]
    assert (cpu.engine, cpu.block_tokens, cpu.context_length) == (EngineKind.VLLM, 128, 2048)


def test_tiny_demo_template_renders_chatml() -> None:
    template = load_profiles(MODELS_DIR)["tiny-demo"].chat_template
    assert template is not None
    environment = jinja2.Environment(autoescape=False)  # noqa: S701 - prompt text, not HTML
    text = environment.from_string(template).render(
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=True,
    )
    assert (
        text
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_defaults_follow_the_core_and_steps_can_be_disabled(tmp_path: Path) -> None:
    path = tmp_path / "plain.toml"
    path.write_text('engine = "vllm"\n[restart.sampled]\nenabled = false\n')
    profile = load_profile(path)
    assert profile.name == "plain"
    assert profile.restart.sampled is None
    assert profile.restart.constrained == RestartRecipe().constrained
    assert profile.restart.burst_levels == RestartRecipe().burst_levels


def test_template_and_tokenizer_files_resolve_next_to_the_profile(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "chat.jinja").write_text("{{ messages[0]['content'] }}")
    (tmp_path / "t" / "tokenizer.json").write_text("{}")
    path = tmp_path / "m.toml"
    path.write_text(
        'engine = "openai"\nchat_template_file = "t/chat.jinja"\ntokenizer_file = "t/tokenizer.json"\n'
    )
    profile = load_profile(path)
    assert profile.chat_template == "{{ messages[0]['content'] }}"
    assert profile.tokenizer_file == str(tmp_path / "t" / "tokenizer.json")


def test_every_mistake_in_every_file_is_reported(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text('engine = "tgi"\nslots = 0\n[restart]\nburst_levels = [1, 0]\n')
    (tmp_path / "b.toml").write_text('engine = "vllm"\ntokenizer_file = "missing.json"\n')
    (tmp_path / "c.toml").write_text('engine = "vllm"\nname = "renamed"\n')
    with pytest.raises(ConfigError) as caught:
        load_profiles(tmp_path)
    paths = {path for path, _ in caught.value.problems}
    assert paths == {
        "profiles.a.engine",
        "profiles.a.slots",
        "profiles.a.restart",
        "profiles.b.tokenizer_file",
        "profiles.c.name",
    }


def test_missing_directory_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_profiles(tmp_path / "nope")
    assert caught.value.problems[0][0] == "fleet.models_dir"


def test_mamba_strategy_only_on_running_state_models(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('engine = "sglang"\nmamba_strategy = "no_buffer"\n')
    with pytest.raises(ConfigError, match="running_state"):
        load_profile(path)
    path.write_text('engine = "sglang"\nrunning_state = true\nmamba_strategy = "sideways"\n')
    with pytest.raises(ConfigError, match="mamba_strategy"):
        load_profile(path)
