"""The console attached to an admission gateway (`slo-console --backend url --url http://GATEWAY`).

A gateway answers GET /gateway/stats; a plain vLLM or OpenAI server has no such path. When the URL is a
gateway, the header and the Process tab say so; when it tunes online (`slo-console gateway --tune`), the
Tuner tab shows its steps, read from GET /gateway/tune every `TUNE_POLL_S` (core.events.online_tune_feed),
marked "online (gateway)": the gateway runs the tune, this console only shows it. The Process tab's
"restart with these knobs" becomes POST /gateway/swap when the gateway launched its server (`--launch`);
otherwise the console says in one line that it cannot swap.

HTTP runs in thread workers (httpx, blocking), never on the UI loop; results hop back with
`call_from_thread`. `GatewayController` is owned by `SloConsoleApp` (console/app.py) and changes only the
app's `ConsoleState` (console/state.py): `state.gateway` and the session it folds the steps into.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from console.messages import SessionChanged
from console.widgets.format import knobs_text
from core.profile import KnobsSpec

if TYPE_CHECKING:
    from console.app import SloConsoleApp

TUNE_POLL_S = 1.5  # how often the Tuner tab asks the gateway for new online steps
PROBE_TIMEOUT_S = 3.0
SWAP_TIMEOUT_S = 1200.0  # a swap starts a vLLM (minutes for a large model) and drains the old one
ONLINE_SOURCE = "online (gateway)"


@dataclass(frozen=True, slots=True)
class GatewayFacts:
    """What GET /gateway/stats said the gateway at `url` can do."""

    url: str
    mode: str
    online_tune: bool
    replica_swap: bool

    def describe(self) -> str:
        can = ["tuning online" if self.online_tune else "not tuning"]
        can.append("swaps its server on restart" if self.replica_swap else "cannot swap its server (no --launch)")
        return f"gateway at {self.url} (mode {self.mode}; {', '.join(can)})"


def probe_gateway(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> GatewayFacts | None:
    """The gateway's facts if `url` is an admission gateway, else None (a plain server, or none at all)."""
    try:
        response = httpx.get(url.rstrip("/") + "/gateway/stats", timeout=timeout_s)
        body = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    if not isinstance(body, dict) or "upstreams" not in body or "mode" not in body:
        return None
    return GatewayFacts(
        url.rstrip("/"), str(body["mode"]), bool(body.get("online_tune")), bool(body.get("replica_swap"))
    )


class GatewayController:
    """Detects a gateway behind --url, folds its online tuner's steps, and asks it to swap its server."""

    def __init__(self, app: SloConsoleApp) -> None:
        self.app = app
        self.state = app.state
        self.next_step = 0  # the index of the first step not yet folded
        self._polling = False

    def probe(self) -> None:
        url = self.state.config.url
        if self.state.config.backend == "url" and url:
            self.app.run_worker(lambda: self._probe(url), thread=True, group="gateway", exit_on_error=False)

    def _probe(self, url: str) -> None:
        facts = probe_gateway(url)
        if facts is not None:
            self.app.call_from_thread(self._attached, facts)

    def _attached(self, facts: GatewayFacts) -> None:
        state = self.state
        state.gateway = facts
        state.session.gateway = facts.describe()
        self.app.sub_title = f"{state.profile.name} · {state.config.backend} · gateway"
        if facts.online_tune:
            state.session.tune.source = ONLINE_SOURCE
            self.poll()
            self.app.set_interval(TUNE_POLL_S, self.poll)
        self.app.process.show_facts()
        self.app.post_message(SessionChanged())

    # ------------------------------------------------------------ online steps

    def poll(self) -> None:
        facts = self.state.gateway
        if facts is None or self._polling or self.state.closed:
            return  # one request at a time: a slow gateway never piles them up
        self._polling = True
        since = self.next_step
        self.app.run_worker(lambda: self._poll(facts.url, since), thread=True, group="gateway", exit_on_error=False)

    def _poll(self, url: str, since: int) -> None:
        feed: dict[str, Any] | None = None
        try:
            response = httpx.get(f"{url}/gateway/tune", params={"since": since}, timeout=PROBE_TIMEOUT_S)
            if response.status_code == 200:
                feed = response.json()
        except (httpx.HTTPError, ValueError):
            feed = None  # the gateway is away for now: the next poll asks again
        finally:
            self.app.call_from_thread(self._fold, feed)

    def _fold(self, feed: dict[str, Any] | None) -> None:
        self._polling = False
        if not isinstance(feed, dict) or feed.get("since") != self.next_step:
            return
        tune, wall = self.state.session.tune, time.monotonic()
        for step in feed.get("steps") or []:
            self.state.session.apply(step, wall)
        tune.source = ONLINE_SOURCE
        tune.online = {k: v for k, v in feed.items() if k != "steps"}
        tune.active = True
        if isinstance(tune.online.get("slo_p99_s"), int | float):
            tune.slo_s = float(tune.online["slo_p99_s"])
        self.next_step = int(feed.get("next", self.next_step))
        self.app.post_message(SessionChanged())

    # ------------------------------------------------------------ swap

    def swap(self, knobs: KnobsSpec) -> None:
        """The Process tab's restart with `knobs`: a replica swap at the gateway, or one line saying why not."""
        facts = self.state.gateway
        assert facts is not None
        if not facts.replica_swap:
            self.app.notify(
                f"The gateway at {facts.url} did not launch its server (no --launch), so it cannot swap it; "
                "restart vLLM yourself, or run the gateway with --launch.",
                title="No swap",
                severity="warning",
            )
            return
        self.app.notify(f"Asking the gateway to swap its server for one with {knobs_text(knobs.model_dump())}…")
        body = knobs.model_dump()
        self.app.run_worker(lambda: self._swap(facts.url, body), thread=True, group="gateway-swap", exit_on_error=False)

    def _swap(self, url: str, body: dict[str, Any]) -> None:
        try:
            response = httpx.post(f"{url}/gateway/swap", json=body, timeout=SWAP_TIMEOUT_S)
            answer = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            self.app.call_from_thread(self._swapped, None, f"{type(exc).__name__}: {exc}")
            return
        if response.status_code == 200 and isinstance(answer, dict):
            self.app.call_from_thread(self._swapped, answer.get("knobs"), None)
        else:
            error = answer.get("error", {}) if isinstance(answer, dict) else {}
            message = error.get("message") if isinstance(error, dict) else None
            self.app.call_from_thread(self._swapped, None, message or f"HTTP {response.status_code}")

    def _swapped(self, knobs: dict[str, Any] | None, problem: str | None) -> None:
        if problem is not None:
            self.app.notify(f"The gateway did not swap: {problem}", title="Swap failed", severity="error", timeout=15)
            return
        state = self.state
        if isinstance(knobs, dict):
            state.session.knobs = knobs
            server = {k: v for k, v in knobs.items() if k in KnobsSpec.model_fields}
            state.profile = state.profile.model_copy(update={"knobs": KnobsSpec.model_validate(server)})
        self.app.notify(f"The gateway now serves with {knobs_text(knobs)}", title="Server swapped")
        self.app.process.show_facts()
        self.app.post_message(SessionChanged())
