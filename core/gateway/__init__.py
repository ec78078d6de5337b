"""The live admission gateway: a scheduling mode run in wall time in front of OpenAI-compatible servers.

server.py      the HTTP front (`Gateway`): forwards, holds or rejects each request as the mode decides
admission.py   the half that knows no HTTP: the mode's `Policy` over live requests, the counters
protocol.py    what the gateway reads from and writes to the wire (SLO headers/body field, error bodies)
upstream.py    the side toward the upstream servers: pooled client, header filtering, reachability probe
standalone.py  `slo-console gateway`: the gateway as a standalone server

The backend that puts a gateway in front of a served server for a run is core/backends/gateway_backend.py:
it composes this package with the load client (core/backends/http_client.py), which itself speaks this
package's protocol, so it sits with the backends above this package, not inside it.
"""
