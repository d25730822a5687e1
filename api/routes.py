"""The tenant's endpoints: submit, list, show, follow, trace, control, approvals, usage.

Every handler takes its tenant from the caller's key (:mod:`api.auth`) and reads or writes only
under it: another tenant's id is looked up in the caller's tenant, where it does not exist, so
it gets the very 404 an id that exists nowhere gets. Refusals change nothing (the router API
validates before it writes).
"""

from __future__ import annotations

import time
import zlib
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request, Response
from fastapi.responses import StreamingResponse

from api.auth import Authenticated, front_of, need, recheck_of
from api.events import ChainFollower, last_event_index
from api.keys import Scope
from api.problems import Problem, from_reins, not_found
from api.usage import history_of, recent_admissions, usage_of
from api.views import (
    Acknowledged,
    Approvals,
    ControlRequest,
    DecisionRequest,
    HeldApproval,
    JobRequest,
    Page,
    Submitted,
    Trajectory,
    Usage,
    UsageHistory,
    Waiting,
    held_of,
    trajectory_of,
)
from kernel.errors import InvalidInput, SnapshotNotFound
from kernel.record import ApprovalStatus, ControlKind, TrajectoryRecord
from kernel.states import LifecycleState
from kernel.trace import postmortem, spans_from_chain

router = APIRouter(prefix="/v1", tags=["trajectories"])
TrajectoryId = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "no such trajectory"}}


def _load(request: Request, tenant: str, trajectory_id: str) -> TrajectoryRecord:
    try:
        return front_of(request).store.load(tenant, trajectory_id)
    except SnapshotNotFound:
        raise not_found() from None


@router.post("/trajectories", status_code=201, response_model=Submitted)
async def submit(
    job: JobRequest,
    grant: Authenticated,
    request: Request,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> Submitted:
    """Create a trajectory for the key's tenant; the agent must be on its allow-list."""
    tenant = need(grant, Scope.SUBMIT)
    body = job.model_dump(exclude_none=True)
    try:
        done, created = front_of(request).submit(tenant, body, idempotency_key)
    except InvalidInput as exc:
        raise from_reins(exc) from None
    state = LifecycleState.READY
    if not created:  # the trajectory this key already named, as it stands now
        response.status_code = 200
        state = front_of(request).store.load(tenant, done.trajectory_id).state
    response.headers["Location"] = f"/v1/trajectories/{done.trajectory_id}"
    return Submitted(
        trajectory_id=done.trajectory_id, version=done.version, state=state.value, created=created
    )


#: A listing's cursor: the state its walk stands in and the last id it returned there.
CURSOR_PATTERN = r"^[A-Z_]{1,32}:[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


@router.get("/trajectories", response_model=Page)
def list_trajectories(
    grant: Authenticated,
    request: Request,
    state: LifecycleState | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
    cursor: Annotated[str | None, Query(pattern=CURSOR_PATTERN)] = None,
) -> Page:
    """The tenant's trajectories (in ``state``), a page at a time; ``cursor`` from the last.

    The walk takes the states in order and pages each through the store's index after the
    last id seen, so a page costs the same however deep it is."""
    tenant = need(grant, Scope.READ)
    store = front_of(request).store
    states = list(LifecycleState) if state is None else [state]
    at, after = states[0], ""
    if cursor:
        name, after = cursor.split(":", 1)
        if name not in LifecycleState.__members__ or LifecycleState[name] not in states:
            raise Problem(422, "Invalid request", "cursor names another state", field="cursor")
        at = LifecycleState[name]
    ids: list[tuple[LifecycleState, str]] = []
    for walked in states[states.index(at) :]:
        got = store.page(tenant, walked, after, limit - len(ids))
        ids += [(walked, tid) for tid in got]
        if len(ids) == limit:
            break
        after = ""
    items = []
    for _, tid in ids:
        try:
            items.append(trajectory_of(store.load(tenant, tid)))
        except SnapshotNotFound:
            continue
    more = len(ids) == limit
    return Page(items=items, next_cursor=f"{ids[-1][0].value}:{ids[-1][1]}" if more else None)


@router.get("/trajectories/{trajectory_id}", response_model=Trajectory, responses=NOT_FOUND)
def show(
    trajectory_id: TrajectoryId,
    grant: Authenticated,
    request: Request,
    response: Response,
    if_none_match: Annotated[str | None, Header(max_length=100)] = None,
) -> Trajectory | Response:
    """One trajectory: state, stop reason, closing message, spend, held approval; its record
    version is the ETag (``If-None-Match`` with it: 304 while nothing changed)."""
    rec = _load(request, need(grant, Scope.READ), trajectory_id)
    front = front_of(request)
    held_back = front.held_back_by(rec)  # a READY run's gate: not in the record, so in the tag
    gated = "" if held_back is None else f"-{zlib.crc32(held_back.encode()):08x}"
    etag = f'"{rec.record_version}{gated}"'
    if if_none_match == etag:
        return Response(status_code=304, headers={"ETag": etag})
    response.headers["ETag"] = etag
    view = trajectory_of(rec, front.catalog_of(rec.agent))
    if held_back is not None:
        call = f"{rec.trajectory_id}/m{rec.turn + 1}"
        view.waiting.append(Waiting(call_id=call, tool="model", on=held_back))
    return view


@router.get(
    "/trajectories/{trajectory_id}/events",
    responses={**NOT_FOUND, 200: {"content": {"text/event-stream": {}}}},
)
def events(
    trajectory_id: TrajectoryId,
    grant: Authenticated,
    request: Request,
    last_event_id: Annotated[str | None, Header(max_length=20)] = None,
    follow: bool = True,
) -> StreamingResponse:
    """The execution chain as Server-Sent Events until the run stops (``follow=false``: the
    rows written so far); resumable with ``Last-Event-ID``. An open stream asks again every
    ``REINS_API_KEY_CACHE_S`` whether its key holds, and ends once it is revoked."""
    tenant = need(grant, Scope.READ)
    rec = _load(request, tenant, trajectory_id)
    try:
        after = last_event_index(last_event_id, rec.chain_length)
    except InvalidInput as exc:
        raise from_reins(exc) from None
    front = front_of(request)
    follower = ChainFollower(
        front.tail(),
        front.store,
        tenant,
        trajectory_id,
        allowed=recheck_of(request),
        recheck_s=front.settings.api_key_cache_s,
    )
    return StreamingResponse(
        follower.events(after, follow),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.get("/trajectories/{trajectory_id}/trace", responses=NOT_FOUND)
def trace(trajectory_id: TrajectoryId, grant: Authenticated, request: Request) -> dict[str, Any]:
    """The span tree and post-mortem of the trajectory's chain."""
    tenant = need(grant, Scope.READ)
    rec = _load(request, tenant, trajectory_id)
    rows = front_of(request).store.read(tenant, trajectory_id)
    spans = spans_from_chain(rows, rec.agent)
    return {
        "trajectory_id": trajectory_id,
        "spans": [s.model_dump(mode="json") for s in spans],
        "postmortem": postmortem(rows),
    }


@router.post(
    "/trajectories/{trajectory_id}/{control}", response_model=Acknowledged, responses=NOT_FOUND
)
def control(
    trajectory_id: TrajectoryId,
    control: ControlKind,
    grant: Authenticated,
    request: Request,
    body: ControlRequest | None = None,
) -> Acknowledged:
    """Pause, resume, cancel, kill or interrupt, as the key's principal."""
    tenant = need(grant, Scope.CONTROL)
    _load(request, tenant, trajectory_id)
    api = front_of(request).router_api()
    instructions = body.instructions if body is not None else None
    ack = api.control(tenant, trajectory_id, control, grant.principal, instructions=instructions)
    rec = _load(request, tenant, trajectory_id)
    return Acknowledged(
        trajectory_id=trajectory_id, version=rec.record_version, state=rec.state.value, detail=ack
    )


@router.get("/approvals", response_model=Approvals, tags=["approvals"])
def approvals(grant: Authenticated, request: Request) -> Approvals:
    """Every approval held in the tenant, the longest held first."""
    tenant = need(grant, Scope.READ)
    front = front_of(request)
    items: list[HeldApproval] = []
    for rec in front.store.records(tenant, LifecycleState.AWAITING_APPROVAL):
        held = held_of(rec, front.catalog_of(rec.agent))
        if (
            held is not None
            and held.status == ApprovalStatus.HELD.value
            and held.reason == "approval"
        ):
            items.append(held)
    items.sort(key=lambda h: (h.held_at, h.trajectory_id))
    return Approvals(items=items)


def _check_decision(rec: TrajectoryRecord, approval_id: str, body: DecisionRequest) -> None:
    held = rec.held
    if held is None or held.approval_id != approval_id:
        raise not_found("approval")
    if held.status is not ApprovalStatus.HELD:
        raise Problem(
            409,
            "Approval closed",
            f"approval {approval_id} is {held.status.value}; nothing was changed",
            field="approval_id",
        )
    if held.expires_at <= time.time():
        raise Problem(
            409,
            "Approval expired",
            f"approval {approval_id} expired; the run will not do this action",
            field="approval_id",
        )
    if body.version != held.held_version:
        raise Problem(
            409,
            "Wrong version",
            f"the approval is held at version {held.held_version}, not {body.version}; "
            "show the trajectory again and review what it holds now",
            field="version",
        )
    if body.digest != held.digest:
        raise Problem(
            409,
            "Wrong digest",
            "the digest is not the held action's; show the trajectory again and review it",
            field="digest",
        )


@router.post(
    "/trajectories/{trajectory_id}/approvals/{approval_id:path}",
    response_model=Acknowledged,
    responses=NOT_FOUND,
    tags=["approvals"],
)
def decide(
    trajectory_id: TrajectoryId,
    approval_id: Annotated[str, Path(max_length=200)],
    body: DecisionRequest,
    grant: Authenticated,
    request: Request,
) -> Acknowledged:
    """Approve or deny a held action, naming its version and digest; the reviewer is the
    key's principal, who must be among the agent's reviewers."""
    tenant = need(grant, Scope.DECIDE)
    rec = _load(request, tenant, trajectory_id)
    _check_decision(rec, approval_id, body)
    result = (
        front_of(request)
        .router_api()
        .decide(
            tenant,
            trajectory_id,
            approval_id=approval_id,
            held_version=body.version,
            digest=body.digest,
            reviewer=grant.principal,
            approve=body.decision == "approve",
            comment=body.comment,
        )
    )
    after = result.record
    return Acknowledged(
        trajectory_id=trajectory_id,
        version=after.record_version,
        state=after.state.value,
        detail={"decision": body.decision, "reviewer": grant.principal},
    )


def _tenants_seen(grant: Authenticated, request: Request) -> list[str]:
    """The tenants whose usage the key may see: every one for an operator, else its own."""
    config = front_of(request).fleet().admission
    if grant.has(Scope.OPERATOR):
        return [t.name for t in config.tenants]
    return [need(grant, Scope.READ)]


@router.get("/usage", response_model=list[Usage], tags=["usage"])
def usage(grant: Authenticated, request: Request) -> list[Usage]:
    """The key's tenant's weight, share, backlog and waits (every tenant's, for an operator,
    with the share each backlogged tenant is owed)."""
    tenants = _tenants_seen(grant, request)
    front = front_of(request)
    admissions = recent_admissions(front.client, front.feed)
    return usage_of(tenants, front.fleet().admission, front.store, admissions)


@router.get("/usage/history", response_model=UsageHistory, tags=["usage"])
def usage_history(
    grant: Authenticated,
    request: Request,
    buckets: Annotated[int, Query(ge=1, le=60)] = 12,
) -> UsageHistory:
    """The key's tenant's admitted share (every tenant's, for an operator) in ``buckets``
    equal spans over the last admissions the fleet keeps, and how contended each span was."""
    tenants = _tenants_seen(grant, request)
    front = front_of(request)
    return history_of(tenants, recent_admissions(front.client, front.feed), buckets)
