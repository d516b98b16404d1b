"""The rollout engine ``vllm``: :class:`~polyturn.rollout.generate.BatchDecoder`'s interface over a vLLM server.

The collector drives it exactly as it drives the home engine (``reset``, ``sample``, ``append``,
``restart_row``, ``keep_rows``). Each row's context is kept here as token ids; :meth:`VLLMDecoder.sample`
sends every active row's whole context as one completions request (prompt token ids in, ``return_token_ids``
and ``logprobs=0`` for the sampled ids and their log-probs out), concurrently, so vLLM batches them; its prefix
cache makes a history sent again cost only its new tokens. Token-in/token-out: the ids recorded are the ids
vLLM sampled, never a re-tokenisation of its text.

Forced rows (epsilon exploration, replayed prefixes) are scored, not sampled: their ids are appended to the
prompt and ``prompt_logprobs`` gives each one's log-prob. vLLM reports those at temperature 1, so a forced row
at a temperature other than 0 or 1 is refused.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch

from polyturn.rollout.generate import SampledAction
from polyturn.rollout.vllm_server import VLLMError, VLLMServer

if TYPE_CHECKING:
    import openai


class VLLMDecoder:
    """A batch of token contexts whose actions a :class:`VLLMServer` samples (the collector's decoder).

    Requests name the model the server currently serves (``server.served``: the base model or the last LoRA
    adapter pushed). ``max_workers`` caps the requests in flight.
    """

    def __init__(self, server: VLLMServer, *, pad_id: int, stop_id: int, max_workers: int = 64) -> None:
        self.server = server
        self.pad_id = pad_id
        self.stop_id = stop_id
        self.rows: list[list[int]] = []
        self.max_workers = max_workers
        self.prefix_tokens_reused = 0  # the home engine's counter; vLLM's prefix cache keeps its own

    @property
    def shared_prefix(self) -> list[int]:
        return []

    @property
    def width(self) -> int:
        return max((len(r) for r in self.rows), default=0)

    def reset(self, contexts: list[list[int]]) -> None:
        if any(len(c) == 0 for c in contexts):
            raise ValueError("Expected every starting context to hold at least one token, got an empty one")
        self.rows = [list(c) for c in contexts]

    def restart_row(self, i: int) -> None:
        self.rows[i] = []

    def keep_rows(self, rows: list[int]) -> None:
        self.rows = [self.rows[i] for i in rows]

    def real_lengths(self) -> list[int]:
        return [len(r) for r in self.rows]

    def append(self, pieces: list[list[int]]) -> None:
        for row, piece in zip(self.rows, pieces):
            row.extend(piece)

    def sample_one(self, ids: list[int], *, temperature: float, top_p: float = 1.0, max_new_tokens: int,
                   seed: int | None = None, on_token: Callable[[int], None] | None = None) -> SampledAction:
        """One action sampled after the context ``ids`` (one completions request; the serving engine calls it
        from many threads at once). ``seed`` is vLLM's per-request seed: the same context and seed give the same
        tokens again (needs a server without chunked prefill: :class:`VLLMServer`). With ``on_token`` the request
        is streamed and each sampled id passed to it as it comes."""
        import openai

        try:
            r = self.server.client.completions.create(
                model=self.server.served, prompt=[ids], max_tokens=max_new_tokens, temperature=temperature,
                top_p=top_p if temperature > 0 else 1.0, logprobs=0, seed=seed, stream=on_token is not None,
                extra_body={"return_token_ids": True, "ignore_eos": True, "stop_token_ids": [self.stop_id],
                            "skip_special_tokens": False})
            chunks = [r] if on_token is None else r  # a stream's chunks carry the ids and log-probs sampled since
            out: list[int] = []
            lps: list[float] = []
            for chunk in chunks:
                choice = chunk.choices[0]
                new = list(choice.token_ids or [])
                out += new
                lps += [float(x) for x in choice.logprobs.token_logprobs] if new else []
                for tok in new if on_token is not None else ():
                    on_token(tok)
        except (openai.APIConnectionError, openai.APITimeoutError) as e:
            self.server.check_alive()
            raise VLLMError(f"the vLLM server at {self.server.base_url} did not answer: {e}") from e
        except openai.APIStatusError as e:
            self._refused(e)
        return SampledAction(ids=out, logprobs=lps, hit_cap=bool(out) and out[-1] != self.stop_id, forced=False)

    def _refused(self, e: openai.APIStatusError) -> None:
        """Raise a :class:`VLLMError` for a request the server answered with an error. A 5xx may mean its engine
        died (``EngineCore encountered an issue``), after which the server exits within seconds: waited for, so
        that the error says it died and the collector starts it again."""
        code = e.status_code
        if code >= 500 and self.server.proc is not None:
            try:
                self.server.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
            self.server.check_alive()
        raise VLLMError(f"the vLLM server refused a request: {code} {e.message}") from e

    def score_one(self, ids: list[int], forced: list[int]) -> SampledAction:
        """The given action ``forced`` after the context ``ids``, with vLLM's log-probs of its ids (at temperature
        1: see the module docstring)."""
        import openai

        try:
            r = self.server.client.completions.create(
                model=self.server.served, prompt=[ids + forced], max_tokens=1, temperature=0.0,
                extra_body={"return_token_ids": True, "prompt_logprobs": 0})
        except (openai.APIConnectionError, openai.APITimeoutError) as e:
            self.server.check_alive()
            raise VLLMError(f"the vLLM server at {self.server.base_url} did not answer: {e}") from e
        except openai.APIStatusError as e:
            self._refused(e)
        entries = r.choices[0].prompt_logprobs[len(ids):]
        lps = [float(e[str(t)]["logprob"]) for e, t in zip(entries, forced)]
        return SampledAction(ids=list(forced), logprobs=lps, hit_cap=bool(forced) and forced[-1] != self.stop_id,
                             forced=True)

    def sample(
        self,
        *,
        active: list[bool],
        temperature: float,
        top_p: float = 1.0,
        max_new_tokens: int,
        forced: list[list[int] | None] | None = None,
        generator: torch.Generator | None = None,
        on_done: Callable[[int, SampledAction], None] | None = None,
    ) -> list[SampledAction | None]:
        """One action per active row, as :meth:`BatchDecoder.sample`; each row's ids join its context.

        With ``generator`` each sampled row's request carries a seed drawn from it, in row order, so a collection
        from the same generator state repeats draw for draw (the server must run without chunked prefill:
        :class:`VLLMServer`); without one, requests are unseeded.
        """
        b = len(active)
        forced = forced or [None] * b
        if 0 < temperature != 1.0 and any(f is not None for i, f in enumerate(forced) if active[i]):
            raise ValueError(f"Expected temperature 0 or 1 for forced actions on rollout.engine = vllm (vLLM "
                             f"scores given ids at temperature 1), got {temperature}")
        rows = [i for i in range(b) if active[i]]
        acts: list[SampledAction | None] = [None] * b
        if not rows:
            return acts
        seeds = {i: int(torch.randint(2**31 - 1, (1,), generator=generator, device=generator.device))
                 for i in rows if forced[i] is None} if generator is not None and temperature > 0 else {}
        with ThreadPoolExecutor(min(self.max_workers, len(rows)), thread_name_prefix="polyturn-vllm") as pool:
            futures = {}
            for i in rows:
                if forced[i] is not None:
                    futures[i] = pool.submit(self.score_one, self.rows[i], list(forced[i])[:max_new_tokens])
                else:
                    futures[i] = pool.submit(self.sample_one, self.rows[i], temperature=temperature, top_p=top_p,
                                             max_new_tokens=max_new_tokens, seed=seeds.get(i))
            for i, fut in futures.items():  # in row order, as the home engine's caller expects
                acts[i] = fut.result()
                if on_done is not None:
                    on_done(i, acts[i])
        for i in rows:
            self.rows[i].extend(acts[i].ids)
        return acts
