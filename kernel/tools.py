"""Tool declarations as the kernel sees them: kind, limits, approval policy, fact fields.

The implementation of a tool (the code that touches the world) is not here: the kernel only
needs what a tool *promises*. A user declares a tool once with :func:`tool` (or builds a
:class:`ToolSpec`), and the same declaration drives validation, approval, facts, the unknown-
outcome rule and the provider's tool schema.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from kernel.job_specs import JobPolicy
from kernel.record import Grants


class ToolKind(StrEnum):
    """A read changes nothing; a write has an effect in the world."""

    READ = "read"
    WRITE = "write"


class OnUnknown(StrEnum):
    """How a write whose outcome is unknown is resolved (never a blind retry)."""

    STOP = "stop"  # end the run with unknown_outcome (seed 000 scenario H)
    RESEND = "resend"  # the backend deduplicates by call key: re-send under the same key
    LOOKUP = "lookup"  # ask the backend whether the key's effect happened


ApprovalPredicate = Callable[[Mapping[str, Any]], bool]


def _never(args: Mapping[str, Any]) -> bool:
    return False


@dataclass(frozen=True)
class Change:
    """One value a call would change, as the record's facts know it before the call."""

    name: str  # the fact's name, e.g. ``ord_1001.refunded_cents``
    before: Any  # None: the record holds no fact of it yet
    after: Any


#: What a call would change, from its arguments and the record's facts (a pure function, so a
#: reviewer's screen can show it without touching the world); [] when it cannot say.
ChangePreview = Callable[[Mapping[str, Any], Mapping[str, Any]], list[Change]]


def _unknown(args: Mapping[str, Any], facts: Mapping[str, Any]) -> list[Change]:
    return []


@dataclass(frozen=True)
class ToolSpec:
    """What a tool promises: argument schema, kind, timeout, liability, approval, facts."""

    name: str
    args_model: type[BaseModel]
    kind: ToolKind = ToolKind.READ
    description: str = ""
    timeout_s: float = 30.0
    liability: Decimal | None = Decimal(0)  # dollar bound per call; None = no finite bound
    needs_approval: ApprovalPredicate = _never
    fact_fields: tuple[str, ...] = ()
    fact_key: str | None = None  # argument whose value prefixes fact names (e.g. order_id)
    target_arg: str | None = None  # argument naming the target a grant may deny
    on_unknown: OnUnknown = OnUnknown.STOP
    deduplicates: bool = False  # the backend replays the stored result for a repeated key
    done_text: str = (
        ""  # closing-message phrase once the effect happened ("your refund was issued")
    )
    not_done_text: str = ""  # phrase when it did not ("the confirmation email was not sent")
    changes: ChangePreview = _unknown  # what a call would change, for its reviewer
    # Memory (kernel.memory_policy): whether its results are content the user or the system
    # wrote (a record's fields), not someone else's words (a ticket's body, a page, an e-mail);
    # and the result fields that name users, whom a fact built from it concerns.
    trusted_output: bool = False
    names_users: tuple[str, ...] = ()
    # The declared schema of an ok result, its ranges as field constraints (None: undeclared).
    # An executed plan's step whose result breaks it does not count as done (kernel.shapes).
    result_model: type[BaseModel] | None = None
    # An asynchronous job (kernel.jobs): started, then reported; None for a call that answers.
    job: JobPolicy | None = None

    def __post_init__(self) -> None:
        resends = self.kind is ToolKind.WRITE and self.on_unknown is OnUnknown.RESEND
        if resends and not self.deduplicates:
            raise ValueError(
                f"tool {self.name}: a write re-sent on an unknown outcome must declare "
                "deduplicates=True (its backend replays a repeated key); otherwise resolve "
                "it by on_unknown=lookup or stop"
            )

    def validate_args(self, args: Any) -> tuple[dict[str, Any] | None, str | None]:
        """Return (normalised arguments, None) or (None, a precise reason)."""
        if not isinstance(args, dict):
            return None, f"{self.name}: arguments must be an object"
        try:
            parsed = self.args_model.model_validate(args)
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"]) or "arguments"
            return None, f"{self.name}: {loc}: {first['msg']}"
        # ``model_dump`` without its wrapper: this runs for every proposed call.
        dumped = self.args_model.__pydantic_serializer__.to_python(
            parsed, mode="json", exclude_none=True
        )
        return dumped, None

    def result_problem(self, result: Mapping[str, Any]) -> str | None:
        """Why an ok ``result`` breaks the declared result schema or a range, or None."""
        if self.result_model is None or result.get("status") != "ok":
            return None
        try:
            self.result_model.model_validate(result)
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"]) or "result"
            return f"{self.name} result: {loc}: {first['msg']}"
        return None

    def permitted(self, grants: Grants, args: Mapping[str, Any]) -> bool:
        """True when the grants allow this call on the target its arguments name."""
        target = str(args.get(self.target_arg)) if self.target_arg else None
        return grants.allows(self.name, self.kind is ToolKind.WRITE, target)

    def json_schema(self) -> dict[str, Any]:
        """The argument schema, for a provider's tool format."""
        return self.args_model.model_json_schema()


@dataclass(frozen=True)
class Catalog:
    """The tools an agent may propose, by name."""

    tools: Mapping[str, ToolSpec] = field(default_factory=dict)

    @classmethod
    def of(cls, specs: Iterable[ToolSpec]) -> Catalog:
        """A catalog of the given specs; names must be unique."""
        table: dict[str, ToolSpec] = {}
        for spec in specs:
            if spec.name in table:
                raise ValueError(f"tool {spec.name!r} is declared twice")
            table[spec.name] = spec
        return cls(table)

    def get(self, name: str) -> ToolSpec | None:
        """The spec of ``name``, or None for an unknown tool."""
        return self.tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self.tools


def tool(
    args: type[BaseModel],
    *,
    kind: ToolKind = ToolKind.READ,
    name: str | None = None,
    timeout_s: float = 30.0,
    liability: Decimal | None = Decimal(0),
    needs_approval: ApprovalPredicate = _never,
    facts: Iterable[str] = (),
    fact_key: str | None = None,
    target_arg: str | None = None,
    on_unknown: OnUnknown = OnUnknown.STOP,
    deduplicates: bool = False,
    done_text: str = "",
    not_done_text: str = "",
    changes: ChangePreview = _unknown,
    trusted_output: bool = False,
    names_users: Iterable[str] = (),
    result: type[BaseModel] | None = None,
    job: JobPolicy | None = None,
) -> Callable[[Callable[..., Any]], DeclaredTool]:
    """Declare a tool: ``@tool(RefundArgs, kind=ToolKind.WRITE, ...)`` over its implementation."""

    def wrap(fn: Callable[..., Any]) -> DeclaredTool:
        spec = ToolSpec(
            name=name or fn.__name__,
            args_model=args,
            kind=kind,
            description=(fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else "",
            timeout_s=timeout_s,
            liability=liability,
            needs_approval=needs_approval,
            fact_fields=tuple(facts),
            fact_key=fact_key,
            target_arg=target_arg,
            on_unknown=on_unknown,
            deduplicates=deduplicates,
            done_text=done_text,
            not_done_text=not_done_text,
            changes=changes,
            trusted_output=trusted_output,
            names_users=tuple(names_users),
            result_model=result,
            job=job,
        )
        return DeclaredTool(spec=spec, fn=fn)

    return wrap


@dataclass(frozen=True)
class DeclaredTool:
    """A tool declaration together with its implementation (called by a runner, never here)."""

    spec: ToolSpec
    fn: Callable[..., Any]


#: The ``code`` of a write a backend refused because it saw a newer fence for the key.
FENCED = "fenced"


class ToolBackend(Protocol):
    """Runs tool calls for one agent. Results are dicts with a ``status``; latency is reported.

    Contract: a write under an idempotency key takes effect at most once; a repeated key
    returns the stored result. A write that outlives its timeout may still take effect, and
    then reports ``{"status": "unknown"}``.

    Fencing (docs/adr/0046-fencing.md): every call and lookup carries the attempt's ``fence``,
    a token that grows each time the kernel re-sends or looks up a key after a recovery or an
    unknown outcome. Atomically with its check of the key, a backend remembers the highest
    fence it has seen for each key, on every call **and every lookup**, and refuses a write
    whose fence is lower than that with ``{"status": "error", "code": "fenced"}`` and no
    effect; an equal or higher fence is served as before (applied, or replayed by key). A
    lookup records its fence so that the answer it gives stays true: once it said ``absent``,
    no older attempt still in flight (a paused worker's) can take effect after it. The kernel
    takes ``fenced`` as evidence that the attempt had no effect (``kernel.results``).
    """

    def call(
        self,
        user: str,
        tool: str,
        args: dict[str, Any],
        key: str,
        timeout_s: float,
        approval: str | None = None,
        *,
        fence: int,
    ) -> tuple[dict[str, Any], float]:
        """Run one call under ``key`` and ``fence``; return (result, seconds spent)."""
        ...

    def lookup(self, tool: str, key: str, *, fence: int) -> tuple[dict[str, Any], float]:
        """Whether the effect of ``key`` happened: its stored result, or status ``absent``;
        ``fence`` is remembered for the key before the answer is given."""
        ...


#: The argument every tool is sent with, so a model can say which plan step a call carries out
#: (the kernel keys idempotency by plan step); a tool whose own schema has it keeps its own.
PLAN_STEP = "plan_step"
PLAN_STEP_SCHEMA = {
    "type": "string",
    "description": "The id of the plan step this call carries out, if it carries one out.",
}


def wire_tools(specs: Iterable[ToolSpec]) -> list[dict[str, Any]]:
    """The specs as a model protocol is sent them (chat-completions ``tools``: ``{"type":
    "function", "function": {"name", "description", "parameters"}}``): each argument schema is
    the spec's own, plus :data:`PLAN_STEP`. The kernel's reservation counts them as sent."""
    out: list[dict[str, Any]] = []
    for spec in specs:
        params = dict(spec.json_schema())
        params.pop("title", None)
        props = dict(params.get("properties") or {})
        if PLAN_STEP not in props:
            props[PLAN_STEP] = PLAN_STEP_SCHEMA
        params["properties"] = props
        params.setdefault("type", "object")
        function: dict[str, Any] = {"name": spec.name, "parameters": params}
        if spec.description:
            function["description"] = spec.description
        out.append({"type": "function", "function": function})
    return out
