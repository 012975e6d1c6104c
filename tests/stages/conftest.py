"""What the multi-turn stage tests share: a tool and one call of it, an engine that records what
it was sent, and raw rows read back per conversation."""

from __future__ import annotations

import collections
import dataclasses
import json

from stages.artifacts.raw import read_raw

WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}

# a user's question, the assistant's call of WEATHER and the tool's result (sharegpt turns)
WEATHER_CALL = [
    {"from": "human", "value": "What is the weather in Paris?"},
    {
        "from": "function_call",
        "value": json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}}),
    },
    {"from": "observation", "value": json.dumps({"temperature": 21, "sky": "clear"})},
]


@dataclasses.dataclass
class Recording:
    """The engine, remembering the prompt ids it was sent for every request."""

    inner: object
    sent: dict = dataclasses.field(default_factory=dict)
    killed_after: int | None = None  # die like a killed process after this many replies

    @property
    def name(self):
        return self.inner.name

    def generate(self, requests, sampling):
        def recorded():
            for request in requests:
                if request is not None:
                    self.sent[request[0]] = request[1]
                yield request

        for n, done in enumerate(self.inner.generate(recorded(), sampling)):
            if n == self.killed_after:
                raise KeyboardInterrupt("killed")
            yield done


def turns_of(out) -> dict[str, list[dict]]:
    """Raw rows per sample, in turn order; no (sample, turn) twice."""
    rows = read_raw(out).to_pylist()
    assert len({(r["sample_id"], r["turn"]) for r in rows}) == len(rows)
    by = collections.defaultdict(list)
    for r in sorted(rows, key=lambda r: (r["sample_id"], r["turn"])):
        by[r["sample_id"]].append(r)
    return dict(by)


def same(turns):
    """The rows without what differs between runs of greedy decoding: timing, the engine and
    the facts it reports (a server names the model it serves), so the fingerprint too."""
    varying = dict(latency_s=None, engine=None, generated_by=None, fingerprint=None)
    return {sid: [dict(r, **varying) for r in rows] for sid, rows in turns.items()}
