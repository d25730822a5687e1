"""Model providers: OpenAI-compatible, Anthropic and scripted providers, built from a profile.

An agent profile chooses its provider by name (``ModelRef.provider``); :func:`make_model` builds
it in a process's boot step from the profile, the scripted policy and the environment (the API
key is read from the variable the profile names, never from the profile itself).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from kernel.agent import AgentProfile, PolicyFn
from worker.models import Model, ScriptedModel
from worker.providers.anthropic import AnthropicMessages
from worker.providers.base import CancelToken, InFlightCalls, ProviderConfigError
from worker.providers.keys import KeyRef
from worker.providers.openai_compat import OpenAICompatible
from worker.providers.scripted import ReplayProvider
from worker.providers.streaming import StreamedProvider
from worker.recording import Recording

SCRIPTED = "scripted"
OPENAI_COMPATIBLE = "openai-compatible"
ANTHROPIC = "anthropic"
REPLAY = "replay"
ROUTES = "routes"  # router.fleet.routes.ROUTES: a fleet worker's, through its document
PROVIDERS = (SCRIPTED, OPENAI_COMPATIBLE, ANTHROPIC, REPLAY, ROUTES)
#: The streamed providers by protocol name.
STREAMED: dict[str, type[StreamedProvider]] = {
    OPENAI_COMPATIBLE: OpenAICompatible,
    ANTHROPIC: AnthropicMessages,
}
ANTHROPIC_URL = "https://api.anthropic.com"

__all__ = [
    "PROVIDERS",
    "STREAMED",
    "AnthropicMessages",
    "CancelToken",
    "InFlightCalls",
    "OpenAICompatible",
    "ProviderConfigError",
    "ReplayProvider",
    "make_model",
    "with_model",
]


def with_model(
    profile: AgentProfile,
    *,
    provider: str | None = None,
    base_url: str | None = None,
    name: str | None = None,
    api_key_env: str | None = None,
) -> AgentProfile:
    """The profile with its model reference changed where a value is given (the CLI's
    ``--provider``, ``--base-url``, ``--model``, ``--api-key-env``); prices stay the profile's."""
    ref = profile.model
    model = dataclasses.replace(
        ref,
        provider=provider if provider is not None else ref.provider,
        base_url=base_url if base_url is not None else ref.base_url,
        name=name if name is not None else ref.name,
        api_key_env=api_key_env if api_key_env is not None else ref.api_key_env,
    )
    return profile if model == ref else dataclasses.replace(profile, model=model)


def make_model(
    profile: AgentProfile,
    policy: PolicyFn,
    env: Mapping[str, str],
    *,
    recording: Recording | None = None,
    latency_header: str | None = None,
    **options: Any,
) -> Model:
    """The provider the profile names: ``scripted`` (the agent's policy),
    ``openai-compatible`` or ``anthropic`` (base URL, model name and key variable from the
    profile; ``latency_header`` and ``options`` go to the provider) or ``replay`` (the model
    replies of ``recording``)."""
    ref = profile.model
    if ref.provider == SCRIPTED:
        return ScriptedModel(policy)
    if ref.provider in STREAMED:
        base_url = ref.base_url or (ANTHROPIC_URL if ref.provider == ANTHROPIC else None)
        if not base_url:
            raise ProviderConfigError(
                f"model {ref.name!r}: {ref.provider} needs a base URL", field="base_url"
            )
        return STREAMED[ref.provider](
            base_url=base_url,
            model=ref.name,
            api_key=KeyRef(env=ref.api_key_env).resolve(env),
            tools=list(profile.catalog.tools.values()),
            latency_header=latency_header,
            **options,
        )
    if ref.provider == ROUTES:
        raise ProviderConfigError(
            f"model {ref.name!r} is routed by a fleet's document (provider {ROUTES!r}); on one "
            "machine name a provider instead (reins run --provider ... --base-url ...)",
            field="provider",
        )
    if ref.provider == REPLAY:
        if recording is None:
            raise ProviderConfigError("provider 'replay' needs a recording to answer from")
        return ReplayProvider(recording)
    raise ProviderConfigError(
        f"agent {profile.name!r}: unknown provider {ref.provider!r}; known: {', '.join(PROVIDERS)}"
    )
