"""The console's pages (``/ui``): sign-in, the approvals inbox, trajectories and their live
detail, fairness. Each handler calls the API's own handler with the signed-in key's grant and
renders what it returns; a refusal (a :class:`~api.problems.Problem`) is rendered as a page
with the same status and words, so the console never shows more than the key may see."""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from fastapi import APIRouter, Request, Response
from fastapi.routing import APIRoute
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.responses import HTMLResponse, RedirectResponse

from api import fleet_routes, routes
from api.auth import front_of
from api.console import session, share_chart, shown
from api.console.origin import same_origin
from api.console.session import SignedIn, SignInNeeded
from api.keys import Grant, Scope
from api.problems import Problem, from_reins, logged
from api.views import DecisionRequest, Trajectory
from kernel.errors import ReinsError
from kernel.record import ControlKind
from kernel.states import TERMINAL, LifecycleState, StopReason

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=HERE / "templates")  # autoescaped (.html)
templates.env.globals.update(
    duration=shown.duration,
    time_left=shown.time_left,
    moment=shown.moment,
    clock_time=shown.clock_time,
)
MAX_FORM = 16_384
LISTED = 500  # the most trajectories the list reads before filtering
HISTORY_SPANS = 12  # the spans of time the fairness chart divides the last admissions into


class PageRoute(APIRoute):
    """A console route: a refusal becomes a page, a missing key the sign-in page."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except SignInNeeded:
                return RedirectResponse(f"/ui/signin?next={request.url.path}", 303)
            except Problem as problem:
                return refused(request, logged(request, problem, problem))
            except ReinsError as exc:
                return refused(request, logged(request, from_reins(exc), exc))

        return run


router = APIRouter(prefix="/ui", route_class=PageRoute, include_in_schema=False)


def page(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
    """Render template ``name`` with the signed-in grant (if any) and ``context``."""
    context.setdefault("grant", None)
    context.setdefault("now", time.time())
    return templates.TemplateResponse(request, name, context, status_code=status)


def refused(request: Request, problem: Problem, grant: Grant | None = None) -> HTMLResponse:
    """The page of a refusal: its status, title and what to do."""
    if grant is None:
        try:
            grant = session.grant_of(request)
        except SignInNeeded:
            grant = None
    return page(request, "problem.html", problem.status, problem=problem, grant=grant)


async def form_of(request: Request) -> dict[str, str]:
    """A posted form (``application/x-www-form-urlencoded``), checked to come from the
    console's own pages; a 413 past :data:`MAX_FORM` bytes."""
    same_origin(request)
    raw = await request.body()
    if len(raw) > MAX_FORM:
        raise Problem(413, "Body too large", f"a console form is at most {MAX_FORM} bytes")
    return dict(parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True))


# --- signing in ---------------------------------------------------------------------------


@router.get("/signin")
def signin_form(request: Request, next: str = "/ui/") -> HTMLResponse:
    """The sign-in form."""
    return page(request, "signin.html", next=_local(next))


@router.post("/signin")
async def signin(request: Request) -> Response:
    """Verify the key and open a session for it; a wrong key changes nothing."""
    form = await form_of(request)
    target = _local(form.get("next", "/ui/"))
    try:
        grant = session.verify(request, form.get("key", ""))
    except Problem as problem:
        return page(request, "signin.html", problem.status, next=target, problem=problem)
    if target == "/ui/":
        target = "/ui/fairness" if grant.tenant is None else "/ui/inbox"
    response = RedirectResponse(target, 303)
    session.keep(response, request, grant, form["key"])
    return response


@router.post("/signout")
async def signout(request: Request) -> Response:
    """End the session: at once, for every request and stream of it."""
    same_origin(request)
    response = RedirectResponse("/ui/signin", 303)
    session.forget(response, request)
    return response


def _local(target: str) -> str:
    """A console path to go to after sign-in; anything else (another site) is the home."""
    if target.startswith("/ui/") and "//" not in target and "\\" not in target:
        return target
    return "/ui/"


@router.get("/")
def home(grant: SignedIn) -> Response:
    """The inbox for a tenant's key, fairness for an operator's."""
    return RedirectResponse("/ui/fairness" if grant.tenant is None else "/ui/inbox", 303)


# --- approvals -----------------------------------------------------------------------------


def _inbox(request: Request, grant: Grant, fragment: bool, **extra: Any) -> HTMLResponse:
    held = routes.approvals(grant, request).items
    runs = {}
    for h in held:  # the budget each has spent so far
        try:
            runs[h.trajectory_id] = _show(request, grant, h.trajectory_id)
        except Problem:  # ended since it was listed
            continue
    name = "inbox_items.html" if fragment else "inbox.html"
    status = extra.pop("status", 200)
    # a refusal of an action no longer held (decided meanwhile) is said above the list
    alone = extra.get("refused_id") not in {h.approval_id for h in held}
    return page(request, name, status, grant=grant, held=held, runs=runs, alone=alone, **extra)


def _show(request: Request, grant: Grant, trajectory_id: str) -> Trajectory:
    shown_now = routes.show(trajectory_id, grant, request, Response(), None)
    assert isinstance(shown_now, Trajectory)  # no If-None-Match: never a 304
    return shown_now


@router.get("/inbox")
def inbox(request: Request, grant: SignedIn) -> HTMLResponse:
    """The tenant's held actions, the longest held first."""
    return _inbox(request, grant, fragment=False)


@router.get("/inbox/items")
def inbox_items(request: Request, grant: SignedIn) -> HTMLResponse:
    """The inbox's list alone, which the page fetches again to show new holds."""
    return _inbox(request, grant, fragment=True)


@router.post("/trajectories/{trajectory_id}/approvals/{approval_id:path}")
async def decide(
    trajectory_id: routes.TrajectoryId, approval_id: str, request: Request, grant: SignedIn
) -> Response:
    """Approve or deny exactly the held action shown; a refusal is shown on the inbox."""
    form = await form_of(request)
    try:
        body = DecisionRequest.model_validate(
            {k: form.get(k, "") for k in ("decision", "version", "digest", "comment")}
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise Problem(422, "Invalid request", f"{field}: {first['msg']}", field=field) from None
    try:
        await run_in_threadpool(routes.decide, trajectory_id, approval_id, body, grant, request)
    except (Problem, ReinsError) as exc:
        problem = exc if isinstance(exc, Problem) else from_reins(exc)
        if problem.status == 404:
            raise problem from None
        refused = {"refusal": problem, "refused_id": approval_id, "status": problem.status}
        return await run_in_threadpool(lambda: _inbox(request, grant, False, **refused))
    return RedirectResponse(f"/ui/trajectories/{trajectory_id}", 303)


# --- trajectories --------------------------------------------------------------------------


@router.get("/trajectories")
def trajectories(request: Request, grant: SignedIn) -> HTMLResponse:
    """The tenant's trajectories, narrowed by state, stop reason, agent and age."""
    filters = shown.Filters.of(dict(request.query_params))
    now = time.time()
    items: list[Trajectory] = []
    cursor: str | None = None
    read = 0
    while read < LISTED:
        listed = routes.list_trajectories(grant, request, filters.state, 100, cursor)
        read += len(listed.items)
        items.extend(t for t in listed.items if filters.keeps(t, now))
        cursor = listed.next_cursor
        if cursor is None:
            break
    items.sort(key=lambda t: -t.submitted_at)
    return page(
        request,
        "trajectories.html",
        grant=grant,
        items=items,
        filters=filters,
        truncated=cursor is not None,
        states=list(LifecycleState),
        stop_reasons=list(StopReason),
        ages=list(shown.AGES),
        now=now,
    )


def _detail(request: Request, grant: Grant, trajectory_id: str, name: str) -> HTMLResponse:
    item = _show(request, grant, trajectory_id)
    rows = front_of(request).store.read(grant.tenant or "", trajectory_id)
    return page(
        request,
        name,
        grant=grant,
        t=item,
        steps=[shown.step_of(r) for r in rows],
        controls=shown.controls_for(item, grant.has(Scope.CONTROL)),
        may_decide=grant.has(Scope.DECIDE),
        ended=LifecycleState(item.state) in TERMINAL,
    )


@router.get("/trajectories/{trajectory_id}")
def trajectory(trajectory_id: routes.TrajectoryId, request: Request, grant: SignedIn) -> Response:
    """One trajectory: its state, budget, timeline and controls; followed live while it runs."""
    return _detail(request, grant, trajectory_id, "trajectory.html")


@router.get("/trajectories/{trajectory_id}/live")
def trajectory_live(
    trajectory_id: routes.TrajectoryId, request: Request, grant: SignedIn
) -> Response:
    """The detail page's live part alone, fetched again on each event of the stream."""
    return _detail(request, grant, trajectory_id, "trajectory_live.html")


@router.get("/trajectories/{trajectory_id}/events")
def trajectory_events(
    trajectory_id: routes.TrajectoryId, request: Request, grant: SignedIn
) -> Response:
    """The API's event stream of the trajectory, for the signed-in key (the browser's
    EventSource sends the cookie, not a bearer header; it resumes with Last-Event-ID)."""
    last = request.headers.get("last-event-id")
    return routes.events(trajectory_id, grant, request, last, True)


@router.post("/trajectories/{trajectory_id}/control/{control}")
async def control(
    trajectory_id: routes.TrajectoryId, control: ControlKind, request: Request, grant: SignedIn
) -> Response:
    """Pause, resume, cancel or kill, as the key's principal; back to the detail page."""
    await form_of(request)
    await run_in_threadpool(routes.control, trajectory_id, control, grant, request, None)
    return RedirectResponse(f"/ui/trajectories/{trajectory_id}", 303)


# --- fairness ------------------------------------------------------------------------------


@router.get("/fairness")
def fairness(request: Request, grant: SignedIn) -> HTMLResponse:
    """Per tenant (every tenant and the ring for an operator key): whether it is backlogged
    and the share it is owed, against its admitted share, backlog and waits (the figures of
    ``reins top``); and the admitted shares over time."""
    usages = routes.usage(grant, request)
    history = routes.usage_history(grant, request, HISTORY_SPANS)
    over_time = share_chart.chart(history, {u.tenant: u.weight_share for u in usages})
    ring = fleet_routes.ring(grant, request) if grant.has(Scope.OPERATOR) else None
    return page(
        request,
        "fairness.html",
        grant=grant,
        shares=shown.shares(usages),
        chart=over_time,
        width=share_chart.WIDTH,
        height=share_chart.HEIGHT,
        y_of=share_chart.y_of,
        ring=ring,
    )
