"""Model profiles: one `models/<name>.toml` per served model -> `warmer.core.model.ModelProfile`.

The profiles shipped with warmer (the repository's `models/`, inside the wheel as `warmer/models`) are
the default set; a config's `fleet.models_dir` adds its own directory on top of them.

A profile holds the facts about a model that change how it is warmed (running state, warm requests per
prefix, cache block size, the restart warm-up recipe, how to render/tokenize when the engine cannot).
The profile's name is its file stem, so two profiles can never share a name. Defaults come from the core
dataclasses, so the file format and the domain never drift apart.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from warmer.config.settings import Problem, validation_problems
from warmer.core.errors import ConfigError
from warmer.core.hosted import ProviderCache
from warmer.core.model import (
    ConstrainedRequest,
    EngineKind,
    MambaStrategy,
    ModelProfile,
    RestartRecipe,
    SampledRequest,
)
from warmer.shipped import shipped_dir

# Default values of the domain types; the file format defaults to exactly these.
_PROFILE = ModelProfile(name="defaults", engine=EngineKind.OPENAI)
_RESTART = RestartRecipe()
_SAMPLED = SampledRequest()
_CONSTRAINED = ConstrainedRequest()


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SampledFile(_Table):
    """`[restart.sampled]`: a request with temperature > 0, so sampling kernels compile before real calls."""

    enabled: bool = True
    prompt: str = Field(default=_SAMPLED.prompt, min_length=1)
    max_tokens: int = Field(default=_SAMPLED.max_tokens, ge=1)
    temperature: float = Field(default=_SAMPLED.temperature, gt=0)

    def to_core(self) -> SampledRequest | None:
        if not self.enabled:
            return None
        return SampledRequest(prompt=self.prompt, max_tokens=self.max_tokens, temperature=self.temperature)


class ConstrainedFile(_Table):
    """`[restart.constrained]`: a JSON-schema constrained request, so the grammar backend loads early."""

    enabled: bool = True
    prompt: str = Field(default=_CONSTRAINED.prompt, min_length=1)
    json_schema: dict[str, Any] = Field(default_factory=lambda: dict(_CONSTRAINED.json_schema))
    max_tokens: int = Field(default=_CONSTRAINED.max_tokens, ge=1)

    def to_core(self) -> ConstrainedRequest | None:
        if not self.enabled:
            return None
        return ConstrainedRequest(
            prompt=self.prompt, json_schema=dict(self.json_schema), max_tokens=self.max_tokens
        )


class RestartFile(_Table):
    """`[restart]`: the warm-up a fresh engine process gets before real traffic."""

    sampled: SampledFile = Field(default_factory=SampledFile)
    constrained: ConstrainedFile = Field(default_factory=ConstrainedFile)
    burst_levels: list[int] = Field(default_factory=lambda: list(_RESTART.burst_levels))
    burst_max_tokens: int = Field(default=_RESTART.burst_max_tokens, ge=1)
    long_prefill_tokens: int = Field(default=_RESTART.long_prefill_tokens, ge=0)
    long_prefill_margin_tokens: int = Field(default=_RESTART.long_prefill_margin_tokens, ge=0)
    long_prefill_headroom: float = Field(default=_RESTART.long_prefill_headroom, ge=1.0, le=16.0)

    @model_validator(mode="after")
    def _levels_positive(self) -> RestartFile:
        if any(level < 1 for level in self.burst_levels):
            raise ValueError("burst_levels must all be >= 1")
        return self

    def to_core(self) -> RestartRecipe:
        return RestartRecipe(
            sampled=self.sampled.to_core(),
            constrained=self.constrained.to_core(),
            burst_levels=tuple(self.burst_levels),
            burst_max_tokens=self.burst_max_tokens,
            long_prefill_tokens=self.long_prefill_tokens,
            long_prefill_margin_tokens=self.long_prefill_margin_tokens,
            long_prefill_headroom=self.long_prefill_headroom,
        )


class ProviderFile(_Table):
    """`[provider]`: a hosted model's prompt-cache rules and prices (engine `openai-hosted` or `anthropic`),
    from the provider's documentation (see `warmer.core.hosted`). Prices per million input tokens."""

    min_cacheable_tokens: int = Field(ge=1)
    increment_tokens: int = Field(default=1, ge=1)
    lifetime_seconds: float = Field(gt=0)
    ttl: Literal["5m", "1h"] | None = None
    input_price: float = Field(ge=0)
    cache_write_price: float = Field(ge=0)
    cache_read_price: float = Field(ge=0)

    def to_core(self) -> ProviderCache:
        return ProviderCache(
            min_cacheable_tokens=self.min_cacheable_tokens,
            increment_tokens=self.increment_tokens,
            lifetime_seconds=self.lifetime_seconds,
            input_price=self.input_price,
            cache_write_price=self.cache_write_price,
            cache_read_price=self.cache_read_price,
            ttl=self.ttl,
        )


class ProfileFile(_Table):
    """The top level of a `models/<name>.toml` file."""

    engine: EngineKind
    served_model_name: str = _PROFILE.served_model_name
    running_state: bool = _PROFILE.running_state
    warm_requests_per_prefix: int = Field(default=_PROFILE.warm_requests_per_prefix, ge=1)
    slots: int = Field(default=_PROFILE.slots, ge=1)
    context_length: int = Field(default=_PROFILE.context_length, ge=16)
    block_tokens: int = Field(default=_PROFILE.block_tokens, ge=1)
    mamba_chunk_size: int = Field(default=_PROFILE.mamba_chunk_size, ge=1)
    mamba_strategy: MambaStrategy | None = None
    keepalive_seconds: float = Field(default=_PROFILE.keepalive_seconds, gt=0)
    prefill_tokens_per_second: float | None = Field(default=None, gt=0)
    restart: RestartFile = Field(default_factory=RestartFile)
    chat_template: str | None = Field(default=None, min_length=1)
    chat_template_file: str | None = Field(default=None, min_length=1)
    tokenizer_file: str | None = Field(default=None, min_length=1)
    bos_token: str = _PROFILE.bos_token
    eos_token: str = _PROFILE.eos_token
    provider: ProviderFile | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ProfileFile:
        if self.engine.hosted != (self.provider is not None):
            raise ValueError("a [provider] table goes with engine openai-hosted or anthropic, and only there")
        if self.provider is not None and self.keepalive_seconds >= self.provider.lifetime_seconds:
            raise ValueError("keepalive_seconds must be shorter than provider.lifetime_seconds")
        if self.chat_template is not None and self.chat_template_file is not None:
            raise ValueError("give chat_template or chat_template_file, not both")
        if self.block_tokens > self.context_length:
            raise ValueError("block_tokens must not exceed context_length")
        if self.mamba_strategy is not None and not self.running_state:
            raise ValueError("mamba_strategy applies only to running_state models")
        if self.restart.long_prefill_tokens > self.context_length:
            raise ValueError("restart.long_prefill_tokens must not exceed context_length")
        return self


def _read_file(path: Path, prefix: str) -> tuple[str | None, list[Problem]]:
    try:
        return path.read_text(encoding="utf-8"), []
    except OSError as exc:
        return None, [(prefix, f"cannot read {path}: {exc.strerror}")]


def load_profile(path: Path) -> ModelProfile:
    """Parse and validate one profile file; ConfigError paths look like `profiles.<name>.<field>`."""
    name = path.stem
    prefix = f"profiles.{name}"
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except OSError as exc:
        raise ConfigError([(prefix, f"cannot read {path}: {exc.strerror}")]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([(prefix, f"invalid TOML in {path.name}: {exc}")]) from None
    try:
        parsed = ProfileFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_problems(exc, prefix)) from None

    problems: list[Problem] = []
    chat_template = parsed.chat_template
    if parsed.chat_template_file is not None:
        template_path = path.parent / parsed.chat_template_file
        chat_template, read_problems = _read_file(template_path, f"{prefix}.chat_template_file")
        problems += read_problems
    tokenizer_file = None
    if parsed.tokenizer_file is not None:
        tokenizer_path = (path.parent / parsed.tokenizer_file).absolute()
        if tokenizer_path.is_file():
            tokenizer_file = str(tokenizer_path)
        else:
            problems.append((f"{prefix}.tokenizer_file", f"file not found: {tokenizer_path}"))
    if problems:
        raise ConfigError(problems)

    return ModelProfile(
        name=name,
        engine=parsed.engine,
        served_model_name=parsed.served_model_name,
        running_state=parsed.running_state,
        warm_requests_per_prefix=parsed.warm_requests_per_prefix,
        slots=parsed.slots,
        context_length=parsed.context_length,
        block_tokens=parsed.block_tokens,
        mamba_chunk_size=parsed.mamba_chunk_size,
        mamba_strategy=parsed.mamba_strategy,
        restart=parsed.restart.to_core(),
        chat_template=chat_template,
        tokenizer_file=tokenizer_file,
        bos_token=parsed.bos_token,
        eos_token=parsed.eos_token,
        keepalive_seconds=parsed.keepalive_seconds,
        prefill_tokens_per_second=parsed.prefill_tokens_per_second,
        provider=None if parsed.provider is None else parsed.provider.to_core(),
    )


def load_profiles(directory: Path, *, field: str = "fleet.models_dir") -> dict[str, ModelProfile]:
    """Every `*.toml` in `directory`, by name. Collects the problems of all files before raising."""
    if not directory.is_dir():
        raise ConfigError([(field, f"directory not found: {directory}")])
    profiles: dict[str, ModelProfile] = {}
    problems: list[Problem] = []
    for path in sorted(directory.glob("*.toml")):
        try:
            profiles[path.stem] = load_profile(path)
        except ConfigError as exc:
            problems += exc.problems
    if problems:
        raise ConfigError(problems)
    return profiles


def load_profile_set(extra_dir: Path | None = None) -> dict[str, ModelProfile]:
    """The shipped profiles, plus those of `extra_dir` (`fleet.models_dir`), which replace a shipped
    profile of the same name: an operator can retune `dense-vllm` without copying the whole set."""
    profiles = load_profiles(shipped_dir("models"), field="(shipped models)")
    if extra_dir is not None:
        profiles.update(load_profiles(extra_dir))
    return profiles
