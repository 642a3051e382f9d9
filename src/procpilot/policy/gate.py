"""Permission tiers for every tool call, per capability and per agent, with an audit trail.

    autonomous         runs
    notify             runs, and an audit event says who ran what, when, with what outcome
    approval_required  held (status ``awaiting_approval``) until an approver approves or denies it,
                       or the approval times out; every decision is an audit event
    blocked            refused with ``PermissionDenied``

A tool's own tier (its ``ToolSpec.tier``) applies unless the agent's policy names another. The gate
is the one audit wrapper: the faces publish nothing themselves, so no call is audited twice or
differently on one path than on another. What is
written to a session's stdin is checked below every face, by the supervisor's write filter
(``policy.spawn_filter.make_write_filter``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from procpilot import chat_context
from procpilot.config import Settings
from procpilot.contract import (
    ID_KEYS,
    AuditEvent,
    PermissionTier,
    ToolResult,
    ToolSpec,
    audit_arguments,
    call_summary,
    redact_environment,
)
from procpilot.engine.events import EventBus
from procpilot.engine.scopes import agent_of
from procpilot.errors import ApprovalDenied, ApprovalNotFound, PermissionDenied
from procpilot.turns import waiting

__all__ = ["DECIDED_KEPT", "ApprovalDenied", "ApprovalRequest", "AuditEvent", "Gate", "PermissionDenied"]

# Scopes whose agent and tiers a gated tool keeps (the table starts again past it).
_SCOPES_KEPT = 1024
# Decided requests are kept for the approvers' list (the console shows them) in a ring: a daemon
# that runs for months holds the newest ones, never every request it was ever asked.
DECIDED_KEPT = 200


@dataclass(slots=True)
class ApprovalRequest:
    id: str
    scope: str
    tool: str
    summary: str
    arguments: dict[str, Any]
    created_at: float
    status: Literal["awaiting_approval", "approved", "denied", "expired"] = "awaiting_approval"
    decided_by: str | None = None
    reason: str | None = None
    # The chat the held call came from, as its caller said (procpilot/chat_context.py): the
    # approver sees it, and every event of the request carries it, decided ones included.
    chat: dict[str, str] | None = None
    _decision: asyncio.Future[bool] | None = None

    def public(self) -> dict[str, Any]:
        """The request as plain data (for an API or CLI), without the future the call waits on."""
        # Not dataclasses.asdict: it deep-copies every field, and a Future cannot be copied.
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "_decision"}
        data["arguments"] = redact_environment(self.arguments)  # an approver sees the names, not the secrets
        return data


def _process_id(arguments: Mapping[str, Any], result: ToolResult | None = None) -> str | None:
    for source in (arguments, result.data if result is not None else {}):
        for key in ID_KEYS:
            if isinstance(source.get(key), str):
                return str(source[key])
    return None


class Gate:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.audit: EventBus[AuditEvent] = EventBus()
        # True iff a request is in _pending: it awaits a decision and its call still waits for one.
        self._pending: dict[str, ApprovalRequest] = {}
        self._decided: deque[ApprovalRequest] = deque(maxlen=DECIDED_KEPT)

    # -- approvals -----------------------------------------------------------------------------

    def pending(self, scope: str | None = None) -> list[ApprovalRequest]:
        return [r for r in self._pending.values() if scope is None or r.scope == scope]

    def decided(self, limit: int = DECIDED_KEPT) -> list[ApprovalRequest]:
        """The newest ``limit`` requests that were approved, denied or expired (at most
        ``DECIDED_KEPT``), the latest decision first."""
        return list(reversed(self._decided))[:limit]

    def _settle(self, request: ApprovalRequest, status: Literal["approved", "denied", "expired"]) -> None:
        """A pending request leaves the pending table for the ring of decided ones."""
        del self._pending[request.id]
        request.status = status
        self._decided.append(request)

    def decide(self, request_id: str, approve: bool, *, approver: str, reason: str | None = None) -> ApprovalRequest:
        """An approver's decision. Only pending requests can be decided."""
        request = self._pending.get(request_id)
        if request is None:
            raise ApprovalNotFound(f"no pending approval request {request_id!r}", request_id=request_id)
        request.decided_by, request.reason = approver, reason
        self._settle(request, "approved" if approve else "denied")
        if request._decision is not None and not request._decision.done():
            request._decision.set_result(approve)
        self._publish(request.scope, request.tool, "approval_required", request.status, request)
        return request

    async def _await_approval(self, scope: str, spec: ToolSpec, arguments: Mapping[str, Any]) -> None:
        request = ApprovalRequest(
            id=secrets.token_hex(8),
            scope=scope,
            tool=spec.name,
            summary=call_summary(spec.name, arguments),
            arguments=dict(arguments),
            created_at=time.time(),
            chat=chat_context.current_parts(),
            _decision=asyncio.get_running_loop().create_future(),
        )
        self._pending[request.id] = request
        self._publish(scope, spec.name, "approval_required", "awaiting_approval", request)
        assert request._decision is not None  # noqa: S101 - set just above
        try:
            # An approver may take minutes: the agent's other calls work meanwhile (turns.py).
            async with waiting(), asyncio.timeout(self.settings.policy.approval_timeout_sec):
                approved = await asyncio.shield(request._decision)
        except TimeoutError:
            self._settle(request, "expired")
            self._publish(scope, spec.name, "approval_required", "expired", request)
            raise ApprovalDenied(f"approval request {request.id} expired", request_id=request.id) from None
        except asyncio.CancelledError:
            # The call went (its client cancelled it, the daemon stops): nothing waits for a
            # decision any more, so the request expires now rather than staying pending for ever.
            if request.id in self._pending:
                self._settle(request, "expired")
                self._publish(scope, spec.name, "approval_required", "expired", request)
            raise
        if not approved:
            raise ApprovalDenied(
                f"approval request {request.id} was denied" + (f": {request.reason}" if request.reason else ""),
                request_id=request.id,
            )

    def _publish(self, scope: str, tool: str, tier: str, outcome: str, request: ApprovalRequest) -> None:
        self.audit.publish(
            AuditEvent(
                scope,
                tool,
                tier,
                outcome,
                request.summary,
                request_id=request.id,
                decided_by=request.decided_by,
                chat=request.chat,
            )
        )

    # -- wrapping ------------------------------------------------------------------------------

    def tier_for(self, scope: str, spec: ToolSpec) -> PermissionTier:
        override = self.settings.policy.for_agent(scope).tiers.get(spec.name)
        return PermissionTier(override) if override else spec.tier

    def wrap(self, tools: list[ToolSpec]) -> list[ToolSpec]:
        return [dataclasses.replace(spec, handler=self._gated(spec)) for spec in tools]

    def _gated(self, spec: ToolSpec) -> Any:
        # Per calling scope, its agent and the agent's tier for this tool: read from the settings
        # (frozen) once per scope rather than on every call, and again when they are replaced.
        tiers: dict[str, tuple[str, PermissionTier]] = {}
        read_from = [self.settings]

        def agent_and_tier(scope: str) -> tuple[str, PermissionTier]:
            if read_from[0] is not self.settings:
                tiers.clear()
                read_from[0] = self.settings
            known = tiers.get(scope)
            if known is None:
                if len(tiers) >= _SCOPES_KEPT:
                    tiers.clear()
                agent = agent_of(scope)
                known = tiers[scope] = (agent, self.tier_for(agent, spec))
            return known

        async def handler(arguments: Mapping[str, Any], scope: str) -> ToolResult:
            # Tiers, approvals and the audit trail are the agent's, whichever of its
            # conversations calls (engine/scopes.py); only the call itself runs in ``scope``.
            agent, tier = agent_and_tier(scope)
            if tier is PermissionTier.AUTONOMOUS:
                if arguments.get("action") not in spec.audited_actions:
                    return await spec.call(arguments, scope)  # nothing to audit: no summary made
                tier = PermissionTier.NOTIFY  # a state change within a read-mostly tool: audited
            summary = call_summary(spec.name, arguments)
            # Which chat asked, as the transport was told (the caller's word, recorded, not trusted).
            chat = chat_context.current_parts()
            if tier is PermissionTier.BLOCKED:
                self.audit.publish(AuditEvent(agent, spec.name, tier.value, "blocked", summary, chat=chat))
                raise PermissionDenied(f"{spec.name} is blocked for agent {agent!r}", tool=spec.name)
            if tier is PermissionTier.APPROVAL:
                await self._await_approval(agent, spec, arguments)
            at, started = time.time(), time.monotonic()

            def publish(outcome: str, result: ToolResult | None) -> None:
                state = result.data.get("state") if result is not None else None
                self.audit.publish(
                    AuditEvent(
                        agent,
                        spec.name,
                        tier.value,
                        outcome,
                        summary,
                        at=at,
                        process_id=_process_id(arguments, result),
                        arguments=audit_arguments(arguments),
                        duration_ms=int((time.monotonic() - started) * 1000),
                        state=state if isinstance(state, str) else None,
                        chat=chat,
                    )
                )

            try:
                # spec.call's work, done here: one coroutine fewer on every audited call
                result = await spec.handler(arguments, scope)
            except asyncio.CancelledError:
                publish("error:Cancelled", None)  # a change may have begun: the trail says it was cut
                raise
            except Exception as exc:
                result = spec.failed(exc, scope)
            if spec.text_only and result.structured:
                result = dataclasses.replace(result, structured=False)
            publish(f"error:{result.data.get('error')}" if result.is_error else "ok", result)
            return result

        return handler
