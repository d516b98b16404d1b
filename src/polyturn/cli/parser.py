"""The ``polyturn`` command line: every subcommand and its arguments.

Building the parser imports argparse and :mod:`polyturn.argtypes` only, so ``polyturn --help`` stays quick; what a
command does is in its own module of :mod:`polyturn.cli`, imported only when it runs. An argument's value is checked
by its ``type``, so a bad one ends in argparse's one-line error and exit status 2.
"""

from __future__ import annotations

import argparse

from polyturn.argtypes import (
    at_least_one,
    json_object,
    non_negative_float,
    non_negative_int,
    port_number,
    positive_int,
    probability,
)

DESCRIPTION = ("The ``polyturn`` command: demos, play, train (and evaluate, make-test-cases, rate, judge, diagnose, "
               "tournament, serve).")


def build_parser() -> argparse.ArgumentParser:
    """The ``polyturn`` parser; ``args.command`` names the subcommand (see :data:`polyturn.cli.COMMANDS`)."""
    p = argparse.ArgumentParser(prog="polyturn", description=DESCRIPTION)
    sub = p.add_subparsers(dest="command", required=True)
    for add in (_demos, _play, _train, _evaluate, _make_test_cases, _rate, _judge, _diagnose, _tournament, _serve):
        add(sub)
    return p


def _demos(sub: argparse._SubParsersAction) -> None:
    """``polyturn demos``: :mod:`polyturn.cli.demos`."""
    p = sub.add_parser("demos", help="write expert / noisy-expert demonstrations as JSONL")
    p.add_argument("--env", default="polyturn/SQLAnalyst-v0")
    p.add_argument("--env-kwargs", "--env_kwargs", type=json_object, default=None, metavar="JSON",
                   help="JSON object of gymnasium.make keyword arguments")
    p.add_argument("--episodes", type=non_negative_int, default=1000)
    p.add_argument("--noise", type=probability, default=0.0, help="noisy-expert error rate in [0, 1] (0 = the expert)")
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument("--expert-options", type=json_object, default=None, metavar="JSON",
                   help='JSON object of the scripted expert\'s options, e.g. \'{"name_candidates": 6}\' for '
                        "TwentyQuestions (config: bc.expert_options)")
    p.add_argument("--balance-by", default=None, metavar="BREAKDOWN",
                   help="group the episodes by this breakdown of the env (CustomerService: intent); with "
                        "--group-shares (config: bc.balance_by)")
    p.add_argument("--group-shares", type=json_object, default=None, metavar="JSON",
                   help='JSON object of each named group\'s share of the episodes, e.g. \'{"forbidden": 0.3}\'; '
                        "the other groups share the rest, and seeds whose group is full are skipped "
                        "(config: bc.group_shares)")
    p.add_argument("--hierarchy", type=positive_int, default=None, metavar="K",
                   help="hierarchical demonstrations (docs/hierarchy.md): the expert cut into the env's subgoals, "
                        "a manager's and a worker's record per task, a subgoal set again after K worker turns "
                        "(config: hierarchy.k)")
    p.add_argument("--out", required=True)


def _play(sub: argparse._SubParsersAction) -> None:
    """``polyturn play``: :mod:`polyturn.cli.play`."""
    p = sub.add_parser("play", help="print episodes of a policy as readable transcripts (or drive a running "
                       "`polyturn serve`'s environment sessions: --server)")
    p.add_argument("--env", default=None, help="env id (default polyturn/SQLAnalyst-v0; with --server, the "
                   "server's default: its first version's training env)")
    p.add_argument("--env-kwargs", "--env_kwargs", type=json_object, default=None, metavar="JSON")
    p.add_argument("--policy", default=None, help="expert (default), noisy, random, or a checkpoint directory")
    p.add_argument("--role", default=None, help="a multi-role env (e.g. Negotiation-v0 with opponent: self): the "
                   "checkpoint's seat (default: the first role); the others are scripted")
    p.add_argument("--partner", default=None, help="a multi-role env: the scripted partner in the other seats, by "
                   "name (default: the first of the env spec's training partners)")
    p.add_argument("--noise", type=probability, default=0.3, help="error rate of --policy noisy, in [0, 1]")
    p.add_argument("--episodes", type=positive_int, default=1)
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument("--temperature", type=non_negative_float, default=0.0,
                   help="0 = greedy (checkpoints and --server; the server's off-policy evaluation needs > 0)")
    srv = p.add_argument_group("episodes played by a running server (docs/offline.md, \"The loop\")")
    srv.add_argument("--server", default=None, metavar="URL",
                     help="play --episodes environment sessions on this `polyturn serve` (e.g. http://127.0.0.1:8000):"
                          " its agent acts and the env's simulated user answers; a server run with --record records "
                          "them")
    srv.add_argument("--model", default=None, metavar="NAME",
                     help="with --server: the version that plays (default: the server's routing decides)")
    srv.add_argument("--concurrency", type=positive_int, default=8, metavar="N",
                     help="with --server: sessions played at once (default 8)")
    srv.add_argument("--files", type=json_object, default=None, metavar="JSON",
                     help='with --server: files from the server\'s --data-dir, e.g. \'{"database": "shop.db"}\'')
    srv.add_argument("--max-turns", type=positive_int, default=None, metavar="N",
                     help="with --server: close each session after at most N agent turns, finished or not (a user "
                          "who leaves: its record has no outcome, which `polyturn judge` can score)")
    srv.add_argument("--quiet", action="store_true", help="with --server: print only the summary, no transcripts")


def _train(sub: argparse._SubParsersAction) -> None:
    """``polyturn train``: :mod:`polyturn.cli.train`."""
    p = sub.add_parser("train", help="BC -> critic warm-up -> mixed -> PPO from a YAML config")
    p.add_argument("--config", default=None, help="YAML config (see configs/)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field, e.g. ppo.clip=0.1")
    p.add_argument("--resume", action="store_true", help="continue from the run's last checkpoint")
    p.add_argument("--overwrite", action="store_true",
                   help="start again in a run.out_dir that holds an earlier run (its metrics, evaluations and "
                        "checkpoints are removed first); without it such a directory is refused")
    p.add_argument("--log-every", type=positive_int, default=1, help="print a metric line every N updates")
    p.add_argument("--nproc", type=positive_int, default=1,
                   help="data-parallel processes on this machine, started with torchrun (gloo on CPU, nccl on GPU)")
    p.add_argument("--offline", nargs="+", metavar="DATA", default=None,
                   help="offline RL from these episode JSONL files before the RL phases (sets offline.data; "
                        "offline.algo and the rest with --set, docs/offline.md)")


def _evaluate(sub: argparse._SubParsersAction) -> None:
    """``polyturn evaluate``: :mod:`polyturn.cli.evaluate`."""
    p = sub.add_parser("evaluate", help="Run policies on test cases and write a comparison report, or estimate a "
                                        "checkpoint on recorded sessions (--offline).",
                       description="Run checkpoints (and the built-in expert / random policies) on the same "
                                   "test cases; write episodes, metrics.json and report.md (+ report.html "
                                   "and figures with --visualize). With --offline DATA --policy DIR: estimate the "
                                   "checkpoint's success and return on sessions recorded by `polyturn serve "
                                   "--record`, without running it (off-policy evaluation, docs/offline.md).")
    p.add_argument("--policy_checkpoint", "--policy-checkpoint", nargs="+", default=None, metavar="DIR",
                   help="checkpoint directories (ckpt-* holding actor/ and config.yaml), actor/ directories, "
                        "run directories (their latest checkpoint), or the names expert / random")
    p.add_argument("--test_cases", "--test-cases", default=None, metavar="FILE",
                   help="JSON or JSONL test cases (see make-test-cases)")
    ope = p.add_argument_group("off-policy evaluation on recorded sessions (docs/offline.md)")
    ope.add_argument("--offline", nargs="+", default=None, metavar="DATA",
                     help="estimate --policy's success and return on sessions recorded by `polyturn serve --record "
                          "DIR` (the DIRs or their sessions.jsonl), without running it")
    ope.add_argument("--policy", default=None, metavar="DIR", help="with --offline: the checkpoint to evaluate")
    ope.add_argument("--clip", type=at_least_one, default=10.0,
                     help="with --offline: the most one episode's importance weight may be (default 10)")
    ope.add_argument("--confidence", type=probability, default=0.95,
                     help="with --offline: the bootstrap interval's confidence (default 0.95)")
    ope.add_argument("--resamples", type=positive_int, default=2000,
                     help="with --offline: bootstrap resamples of the episodes (default 2000)")
    p.add_argument("--visualize", action="store_true", help="also draw figures and write report.html")
    p.add_argument("--out", default="eval_report", metavar="DIR", help="output directory (default: eval_report)")
    p.add_argument("--temperature", type=non_negative_float, default=0.0, help="0 = greedy (default); > 0 samples")
    p.add_argument("--seed", type=non_negative_int, default=0,
                   help="seed for sampling, the random policy and bootstraps")
    p.add_argument("--num_envs", "--num-envs", type=positive_int, default=16,
                   help="conversations an actor runs in one batch")
    p.add_argument("--baseline", default=None, metavar="NAME",
                   help="policy name the differences are taken against (default: the first)")
    p.add_argument("--compare", nargs="+", default=None, metavar="NAME",
                   help="only compare these policies with the baseline (default: all)")
    p.add_argument("--embedder", choices=("minilm", "none"), default="minilm",
                   help="MiniLM embeddings for coherence and failure clusters, or none to skip both")
    p.add_argument("--best-of", "--best_of", type=positive_int, default=1, metavar="N",
                   help="sample N candidate turns per state and play the action critic's favourite (default 1: off)")
    p.add_argument("--critic", default=None, metavar="DIR",
                   help="with --best-of: the action critic (a checkpoint or its critic/ directory; default: each "
                        "checkpoint's own). It must not read privileged text unless --oracle")
    p.add_argument("--oracle", action="store_true",
                   help="with --best-of: allow a critic that reads privileged text; the rows are labelled oracle")


def _make_test_cases(sub: argparse._SubParsersAction) -> None:
    """``polyturn make-test-cases``: :mod:`polyturn.cli.make_test_cases`."""
    p = sub.add_parser("make-test-cases", help="Write a test-case file from a range of task seeds.")
    p.add_argument("--env", default="polyturn/SQLAnalyst-v0", help="env id")
    p.add_argument("--seeds", required=True, metavar="A:B", help="task seeds A..B-1 (use held-out seeds)")
    p.add_argument("--out", required=True, metavar="FILE", help="JSONL file to write")
    p.add_argument("--env_kwargs", "--env-kwargs", type=json_object, default=None, metavar="JSON",
                   help='gymnasium.make keyword arguments, e.g. \'{"max_turns": 6}\'')


def _rate(sub: argparse._SubParsersAction) -> None:
    """``polyturn rate``: :mod:`polyturn.cli.rate`."""
    p = sub.add_parser("rate", help="Blind pairwise preference ratings of two evaluations (web page or judge).")
    p.add_argument("--pairs", nargs=2, required=True, metavar=("A_DIR", "B_DIR"),
                   help="two evaluate output directories (one policy each) or episode JSONL files")
    p.add_argument("--port", type=port_number, default=8765, help="port on 127.0.0.1 (0 picks a free one)")
    p.add_argument("--out", default="ratings.jsonl", metavar="FILE", help="ratings JSONL (appended to)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed of the left/right order")
    p.add_argument("--judge", choices=("human", "heuristic", "llm"), default="human",
                   help="human: serve the rating page; heuristic: rate offline (success > fewer turns > fewer errors); "
                        "llm: ask an OpenAI-compatible chat model (--judge_model, --judge_url)")
    p.add_argument("--judge_model", "--judge-model", default=None, metavar="NAME", help="model name for --judge llm")
    p.add_argument("--judge_url", "--judge-url", default=None, metavar="URL",
                   help="OpenAI-compatible base URL for --judge llm (default $OPENAI_BASE_URL or "
                        "https://api.openai.com/v1; key from $OPENAI_API_KEY)")
    p.add_argument("--judge_timeout", "--judge-timeout", type=non_negative_float, default=60.0, metavar="S",
                   help="seconds one --judge llm call may take (default 60)")
    p.add_argument("--judge_retries", "--judge-retries", type=non_negative_int, default=2, metavar="N",
                   help="retries of a --judge llm call that timed out or got HTTP 408/409/429/5xx (default 2)")
    p.add_argument("--max_pairs", "--max-pairs", type=positive_int, default=None, help="rate at most this many pairs")


def _judge(sub: argparse._SubParsersAction) -> None:
    """``polyturn judge``: :mod:`polyturn.cli.judge`."""
    p = sub.add_parser("judge", help="Score recorded episodes with an LLM judge (an OpenAI-compatible endpoint).",
                       description="Ask a chat model to score each episode 1-10 with the env's rubric and write the "
                                   "records with their scores; offline training reads them as the return of episodes "
                                   "with no known outcome (docs/judge.md).")
    p.add_argument("--data", nargs="+", required=True, metavar="FILE",
                   help="episode JSONL files (serve --record's DIR/sessions.jsonl, evaluation episodes, demos)")
    p.add_argument("--endpoint", default=None, metavar="URL",
                   help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1 (default $OPENAI_BASE_URL or "
                        "https://api.openai.com/v1; key from $OPENAI_API_KEY, none needed for a local server)")
    p.add_argument("--model", required=True, metavar="NAME", help="the judge model's name on that server")
    p.add_argument("--out", required=True, metavar="FILE", help="the judged records (JSONL)")
    p.add_argument("--cache", default=None, metavar="FILE",
                   help="verdict cache (default OUT's name + .judge-cache.jsonl): episodes judged before are not sent")
    p.add_argument("--timeout", type=non_negative_float, default=60.0, metavar="S", help="seconds one call may take")
    p.add_argument("--retries", type=non_negative_int, default=2, metavar="N",
                   help="retries of a call that timed out or got HTTP 408/409/429/5xx (default 2)")
    p.add_argument("--concurrency", type=positive_int, default=4, metavar="N", help="calls in flight at most")
    p.add_argument("--max-tokens", "--max_tokens", type=positive_int, default=512, metavar="N",
                   help="longest reply under --scoring score (default 512)")
    p.add_argument("--scoring", choices=("score", "yes_no"), default="score",
                   help="score: the judge writes its reasons and a last line 'Score: N' (1-10); yes_no: it is asked "
                        "whether the assistant answered correctly, and the score is P(Yes) against P(No) from its "
                        "first token's top log-probs (needs an endpoint that returns them: vLLM, OpenAI; small "
                        "judges follow it where they write no Score line)")
    p.add_argument("--on_malformed", "--on-malformed", choices=("stop", "record"), default="stop",
                   help="a reply without a 'Score: N' line (yes_no: without Yes or No among the top tokens): stop "
                        "with an error naming the episode (default; what was "
                        "judged stays in the cache), or record it in the episode's judge_error and go on")


def _diagnose(sub: argparse._SubParsersAction) -> None:
    """``polyturn diagnose``: :mod:`polyturn.cli.diagnose`."""
    p = sub.add_parser("diagnose", help="Training curves, a critic check and warnings for a run.")
    p.add_argument("--run", required=True, metavar="DIR", help="run directory (holds metrics.jsonl)")
    p.add_argument("--checkpoint", default=None, metavar="NAME", help="checkpoint name (default: latest)")
    p.add_argument("--episodes", type=non_negative_int, default=16,
                   help="held-out episodes for the critic check (0 skips it)")
    p.add_argument("--out", default=None, metavar="DIR", help="output directory (default: <run>/diagnose)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="sampling seed of the validation episodes")


def _tournament(sub: argparse._SubParsersAction) -> None:
    """``polyturn tournament``: :mod:`polyturn.cli.tournament`."""
    p = sub.add_parser("tournament", help="A multi-role game's checkpoints against scripted partners (training and "
                       "evaluation-only) in every seat, and against each other.")
    p.add_argument("--checkpoint", action="append", default=[], metavar="DIR",
                   help="a checkpoint (or run) directory; repeat to compare several (each gets a partner table)")
    p.add_argument("--pool", default=None, metavar="RUN",
                   help="also play the opponent pool of a self-play run (RUN/pool/*) head to head with the "
                        "checkpoints")
    p.add_argument("--env-kwargs", type=json_object, default=None, metavar="JSON",
                   help="env kwargs of the multi-role form (default: the first checkpoint's; e.g. "
                        "'{\"opponent\": \"self\"}' for a Negotiation checkpoint trained against scripted partners)")
    p.add_argument("--partner", action="append", default=[], metavar="NAME",
                   help="play only this scripted partner (repeatable; default: every training and "
                        "evaluation-only one)")
    p.add_argument("--episodes", type=positive_int, default=100, help="held-out tasks per partner and seat")
    p.add_argument("--matrix-episodes", type=positive_int, default=50,
                   help="held-out tasks per seat for each head-to-head pair")
    p.add_argument("--temperature", type=non_negative_float, default=0.0, help="sampling temperature (0: greedy)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="sampling seed")
    p.add_argument("--out", required=True, metavar="DIR", help="where tournament.md/.json and the matrix plot go")


def _serve(sub: argparse._SubParsersAction) -> None:
    """``polyturn serve``: :mod:`polyturn.cli.serve` (docs/serving.md)."""
    p = sub.add_parser("serve", help="serve checkpoints over an OpenAI-compatible HTTP API (docs/serving.md)")
    p.add_argument("--checkpoint", action="append", required=True, metavar="DIR",
                   help="a checkpoint (or run) directory; repeat for A/B versions (the first takes all traffic)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--record", default=None, metavar="DIR", help="write finished sessions to DIR/sessions.jsonl")
    p.add_argument("--session-timeout", type=float, default=300.0, metavar="S", help="idle seconds before expiry")
    p.add_argument("--max-sessions", type=int, default=64, help="live sessions (cache rows) per version")
    p.add_argument("--data-dir", default=None, help="the only directory environment sessions may open files from")
    p.add_argument("--checkpoint-dir", action="append", default=None, metavar="DIR",
                   help="directories versions may be loaded from at run time (default: the checkpoints' parents)")
    p.add_argument("--admin-token-file", default=None,
                   help="file holding the admin bearer token (else env POLYTURN_ADMIN_TOKEN; none: admin off)")
    p.add_argument("--max-body-bytes", type=int, default=1_000_000)
    p.add_argument("--max-message-chars", type=int, default=8000)
    p.add_argument("--explore-epsilon", type=float, default=0.0, help="exploration in production (0 = off)")
    p.add_argument("--explore-candidates", type=int, default=4)
    p.add_argument("--explore-min-logprob", type=float, default=-1.0,
                   help="confidence filter: candidates below this mean token log-prob are dropped")
    p.add_argument("--explore-min-value", type=float, default=None,
                   help="with a critic in the checkpoint: explore only states whose value V(s) is at least this")
    p.add_argument("--explore-oracle-critic", action="store_true",
                   help="allow --explore-min-value with a critic that reads privileged text (an oracle experiment)")
    p.add_argument("--unbatched", action="store_true",
                   help="serve one request at a time, each session with its own single-row cache (a baseline)")
    p.add_argument("--prefill-chunk", type=int, default=64,
                   help="most context tokens a session feeds per decode step (a long tool result is prefilled in "
                        "chunks beside the other sessions' decoding); 0: all at once")
    p.add_argument("--device", default="auto", help="where the actors run: auto (the GPU when there is one), cpu, "
                   "cuda, cuda:N or mps")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "fp16"),
                   help="the forward passes' precision (fp32, the default, gives the evaluations' numbers)")
    p.add_argument("--merge-lora", action="store_true",
                   help="fold a LoRA actor's adapters into its base weights (fewer kernels a step; on the CPU it "
                   "measured no faster, docs/serving.md); always done with --engine vllm")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1: fastest for small models on a shared CPU; raise for large "
                        "ones); with --engine vllm, the vLLM server's too")
    p.add_argument("--engine", choices=("home", "vllm"), default="home",
                   help="what decodes: home (polyturn's batched KV-cache engine) or vllm (a vLLM server per version, "
                        "started from --vllm-python; flat checkpoints; docs/vllm.md)")
    p.add_argument("--vllm-python", default=".venv-vllm/bin/python", metavar="PATH",
                   help="with --engine vllm: the interpreter of vLLM's virtual environment (`make vllm-venv` "
                        "installs it; default %(default)s, as rollout.vllm_python)")
    ope = p.add_argument_group("the ramp's off-policy gate (docs/offline.md)")
    ope.add_argument("--ope-margin", type=non_negative_float, default=None, metavar="M",
                     help="gate every ramp past 20%%: refuse a version whose off-policy lower bound on the "
                          "incumbent's recorded sessions is below the incumbent's value minus M (off by default)")
    ope.add_argument("--ope-metric", choices=("success", "return"), default="success",
                     help="what the gate compares (default success)")
    ope.add_argument("--ope-estimator", choices=("wis", "dr"), default="wis",
                     help="per-decision WIS, or doubly robust with the new version's critic (return only)")
    ope.add_argument("--ope-clip", type=at_least_one, default=10.0, help="the most one session may weigh (default 10)")
    ope.add_argument("--ope-confidence", type=probability, default=0.95,
                     help="the bootstrap interval's confidence; the gate reads its lower end (default 0.95)")
    ope.add_argument("--ope-min-sessions", type=positive_int, default=20,
                     help="fewer usable recorded sessions of the incumbent refuse the ramp (default 20)")
    ope.add_argument("--ope-max-sessions", type=positive_int, default=1000,
                     help="the check reads the incumbent's most recent sessions, at most this many (default 1000)")
    ope.add_argument("--ope-data", nargs="+", default=[], metavar="FILE",
                     help="recorded sessions beside this server's --record DIR (e.g. an earlier server's)")
