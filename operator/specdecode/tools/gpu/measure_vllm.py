#!/usr/bin/env python3
"""Measure a real vLLM engine on one GPU (issue 55): step time against the running batch for
speculation off, a draft model at K=1..5, n-gram and a per-batch-size table with a K 0 band;
the KV-cache capacity vLLM reports; the time from process start to ready; the raw /metrics.

Standalone (standard library only) so that it runs on the GPU machine beside a carried vLLM:
    python3 measure_vllm.py --out DIR --configs off,draft-k3,table-k3-0 --deadline-s 540

Each config is one `vllm serve` process (dummy weights, token-id prompts, no tokenizer). For
each concurrency c, c requests of PROMPT random token ids and exactly OUTPUT output tokens are
sent at once; /metrics is polled every POLL_S seconds. The steady window is from the poll at
which every request has had its first token (TTFT count up by c) to the last poll before the
first request finishes (e2e count still unchanged): in it all c requests decode and nothing
prefills, so engine steps (iteration_tokens count), inter-token latency (sum/count), generation
tokens and the spec-decode counters are read as deltas over that window. Deltas over the whole
point (before and after) are written too.

Results are appended as they come (CSV and JSON lines), so a call cut off by its time limit
still returns what it measured; a later call resumes by naming the configs not yet done.
"""

from __future__ import annotations

import argparse
import csv
import http.client
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

PORT = 8000
POLL_S = 0.2
BLOCK = 16  # vLLM's default KV block size on CUDA

TARGET_DIR = "/root/models/llama-3.1-8b-instruct-shape"
DRAFT_DIR = "/root/models/llama-3.2-1b-instruct-shape"

# Published architecture of Llama-3.1-8B-Instruct and Llama-3.2-1B-Instruct (their config.json
# on the hub); weights are vLLM's dummy initialisation, so only shapes matter.
LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
    "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "initializer_range": 0.02, "max_position_embeddings": 131072,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "vocab_size": 128256,
}
LLAMA_1B = dict(LLAMA_8B, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                tie_word_embeddings=True,
                rope_scaling={"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 8192, "rope_type": "llama3"})


def draft(k: int, **extra) -> dict:
    return {"method": "draft_model", "model": DRAFT_DIR, "num_speculative_tokens": k, **extra}


# name -> speculative config (None: speculation off). Extra vLLM flags per config in FLAGS.
CONFIGS: dict[str, dict | None] = {
    "off": None,
    **{f"draft-k{k}": draft(k) for k in range(1, 6)},
    "ngram-k3": {"method": "ngram", "num_speculative_tokens": 3,
                 "prompt_lookup_min": 2, "prompt_lookup_max": 5},
    "table-k3-0": draft(3, num_speculative_tokens_per_batch_size=[[1, 16, 3], [17, 1024, 0]]),
    # Same engine as draft-k3 with vLLM's synthetic rejection sampler (a set acceptance), to see
    # how ITL and TPOT separate when drafts are accepted; not a real acceptance.
    "draft-k3-synth": draft(3, rejection_sample_method="synthetic",
                            synthetic_acceptance_rates=[0.8, 0.64, 0.51]),
    # A second start of `off` on the same machine: vLLM's compile cache is warm now.
    "off-restart": None,
}
FLAGS: dict[str, list[str]] = {}

# Compile caches (vLLM's torch.compile cache, Inductor's, Triton's) per config: the configs whose
# restart price the issue asks for start with empty caches, as a new pod does; `off-restart`
# reuses `off`'s (a restart with a kept cache); the others share one set, so their start times
# are partly warm (the target's graph and kernels were built before).
COLD = {"off", "draft-k3", "table-k3-0"}


def cache_label(name: str) -> str:
    if name in COLD:
        return name
    return "off" if name == "off-restart" else "shared"


def cache_env(name: str, root: str) -> dict:
    base = os.path.join(root, cache_label(name))
    return {"VLLM_CACHE_ROOT": os.path.join(base, "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": os.path.join(base, "inductor"),
            "TRITON_CACHE_DIR": os.path.join(base, "triton")}

COUNTERS = [
    "vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_count",
    "vllm:inter_token_latency_seconds_sum", "vllm:inter_token_latency_seconds_count",
    "vllm:request_time_per_output_token_seconds_sum",
    "vllm:request_time_per_output_token_seconds_count",
    "vllm:iteration_tokens_total_sum", "vllm:iteration_tokens_total_count",
    "vllm:generation_tokens_total", "vllm:prompt_tokens_total", "vllm:num_preemptions_total",
    "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
]
GAUGES = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"]
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')

STEP_FIELDS = [
    "config", "method", "k", "concurrency_requested", "concurrency", "running_batch",
    "window_s", "steps", "step_ms", "itl_mean_ms", "tpot_mean_ms", "output_tok_s",
    "tokens_per_step", "gen_tokens_per_req_step", "acceptance_rate", "mean_accepted_len",
    "accepted_per_pos", "preemptions", "whole_itl_mean_ms", "whole_output_tok_s", "point_wall_s",
    "client_tokens_ok", "context_tokens_mid", "note",
]
START_FIELDS = [
    "config", "spec_config", "seconds_to_ready", "ready", "num_gpu_blocks", "kv_cache_tokens",
    "max_concurrency_at_max_model_len", "max_model_len", "fits_1200_token_requests",
    "model_load_gib", "model_load_s", "compile_s", "graph_capture_s", "graph_capture_gib",
    "init_engine_s", "gpu_mem_used_mib", "cudagraph_note", "gpu_memory_utilization", "compile_cache", "note",
]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def request(method: str, path: str, body: dict | None = None, timeout: float = 10.0):
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def scrape() -> tuple[str, dict]:
    status, raw = request("GET", "/metrics", timeout=5.0)
    text = raw.decode()
    values: dict = {}
    per_pos: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = SAMPLE.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name == PER_POS:
            pos = re.search(r'position="(\d+)"', labels)
            if pos:
                per_pos[pos.group(1)] = per_pos.get(pos.group(1), 0.0) + value
        elif name in COUNTERS or name in GAUGES:
            values[name] = values.get(name, 0.0) + value
    values["per_pos"] = per_pos
    return text, values


def delta(a: dict, b: dict, name: str) -> float:
    return b.get(name, 0.0) - a.get(name, 0.0)


def gpu_mem_used_mib() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
        return out.splitlines()[0].strip()
    except Exception:  # noqa: BLE001
        return ""


class Server:
    def __init__(self, name: str, spec: dict | None, logdir: str, args) -> None:
        self.name, self.spec, self.args = name, spec, args
        self.logpath = os.path.join(logdir, f"server-{name}.log")
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", TARGET_DIR,
               "--served-model-name", "llama", "--load-format", "dummy", "--skip-tokenizer-init",
               "--max-model-len", str(self.args.max_model_len), "--port", str(PORT),
               "--gpu-memory-utilization", str(self.args.gpu_memory_utilization),
               "--seed", "0"]
        if self.spec is not None:
            cmd += ["--speculative-config", json.dumps(self.spec, separators=(",", ":"))]
        return cmd + FLAGS.get(self.name, [])

    def start(self, limit_s: float) -> tuple[bool, float]:
        cmd = self.command()
        with open(self.logpath, "w") as f:
            f.write("$ " + " ".join(cmd) + "\n")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=open(self.logpath, "a"), stderr=subprocess.STDOUT,
                                     start_new_session=True,
                                     env={**os.environ, **cache_env(self.name, self.args.cache_root)})
        while time.monotonic() - t0 < limit_s:
            if self.proc.poll() is not None:
                return False, time.monotonic() - t0
            try:
                status, _ = request("GET", "/health", timeout=2.0)
                if status == 200:
                    return True, time.monotonic() - t0
            except OSError:
                pass
            time.sleep(0.25)
        return False, time.monotonic() - t0

    def stop(self) -> None:
        if self.proc is None:
            return
        pgid = self.proc.pid  # its own session: the group id is the pid we started
        for sig, wait in ((signal.SIGINT, 25), (signal.SIGKILL, 10)):
            if self.proc.poll() is not None:
                break
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
        try:  # children of the group that outlived the parent
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for _ in range(40):  # GPU memory back
            used = gpu_mem_used_mib()
            if used and int(used) < 2000:
                break
            time.sleep(0.5)

    def startup_facts(self) -> dict:
        text = open(self.logpath, errors="replace").read()

        def find(pattern: str, cast=float):
            m = re.findall(pattern, text)
            if not m:
                return ""
            v = m[-1]
            return cast(v.replace(",", "")) if cast else v

        facts = {
            "kv_cache_tokens": find(r"GPU KV cache size: ([\d,]+) tokens", int),
            "max_concurrency_at_max_model_len": find(r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x"),
            "num_gpu_blocks": find(r"num_gpu_blocks[ =:]+(?:is: )?(\d+)", int),
            "model_load_gib": find(r"Model loading took ([\d.]+) GiB"),
            "model_load_s": find(r"Model loading took [\d.]+ GiB(?: memory)? and ([\d.]+) seconds"),
            "compile_s": find(r"compilation: ([\d.]+) s"),
            "graph_capture_s": find(r"Graph capturing finished in ([\d.]+) secs"),
            "graph_capture_gib": find(r"Graph capturing finished in [\d.]+ secs, took ([\d.]+) GiB"),
            "init_engine_s": find(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"),
        }
        notes = []
        if "Overriding cudagraph_mode" in text:
            notes.append("cudagraph_mode overridden to PIECEWISE (dynamic SD)")
        m = re.findall(r"cudagraph_mode[=:' ]+(?:CUDAGraphMode\.)?([A-Z_]+)", text)
        if m:
            notes.append(f"cudagraph_mode {m[0]}")
        facts["cudagraph_note"] = "; ".join(notes)
        return facts


def prompts(seed: int, c: int, length: int) -> list[list[int]]:
    out = []
    for i in range(c):
        rng = random.Random(seed * 100003 + c * 1009 + i)
        out.append([rng.randrange(1000, 128000) for _ in range(length)])
    return out


def one_request(tokens: list[int], output: int, timeout: float) -> int:
    body = {"model": "llama", "prompt": tokens, "max_tokens": output, "min_tokens": output,
            "ignore_eos": True, "temperature": 0.0, "return_token_ids": True}
    for attempt in range(4):  # a refused or reset connection never reached the engine
        try:
            status, raw = request("POST", "/v1/completions", body, timeout=timeout)
            break
        except (ConnectionResetError, ConnectionRefusedError):
            if attempt == 3:
                raise
            time.sleep(0.05 * (attempt + 1))
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {raw[:400]!r}")
    data = json.loads(raw)
    choice = data["choices"][0]
    ids = choice.get("token_ids")
    if ids is None:
        return int(data.get("usage", {}).get("completion_tokens", -1))
    return len(ids)


def measure_point(name: str, spec: dict | None, c_req: int, c: int, args, deadline: float) -> dict:
    k = (spec or {}).get("num_speculative_tokens", 0)
    method = (spec or {}).get("method", "off")
    batch = prompts(args.seed + c_req, c, args.prompt)
    polls: list[tuple[float, dict]] = []
    stop = threading.Event()

    def poller() -> None:
        while not stop.is_set():
            t = time.monotonic()
            try:
                polls.append((t, scrape()[1]))
            except OSError:
                pass
            stop.wait(max(0.0, POLL_S - (time.monotonic() - t)))

    _, before = scrape()
    t0 = time.monotonic()
    th = threading.Thread(target=poller, daemon=True)
    th.start()
    timeout = max(20.0, deadline - time.monotonic())
    errors: list[str] = []
    with ThreadPoolExecutor(max_workers=c) as pool:
        futs = [pool.submit(one_request, p, args.output, timeout) for p in batch]
        counts = []
        for f in futs:
            try:
                counts.append(f.result())
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e)[:300])
    wall = time.monotonic() - t0
    time.sleep(0.3)
    stop.set()
    th.join()
    text_after, after = scrape()

    row = {"config": name, "method": method, "k": k, "concurrency_requested": c_req,
           "concurrency": c, "point_wall_s": round(wall, 3),
           "client_tokens_ok": sum(1 for n in counts if n == args.output)}
    gen = delta(before, after, "vllm:generation_tokens_total")
    itl_n = delta(before, after, "vllm:inter_token_latency_seconds_count")
    if itl_n:
        row["whole_itl_mean_ms"] = round(1000 * delta(before, after, "vllm:inter_token_latency_seconds_sum") / itl_n, 4)
    row["whole_output_tok_s"] = round(gen / wall, 2) if wall else ""
    row["preemptions"] = delta(before, after, "vllm:num_preemptions_total")

    # steady window: all first tokens in, no request finished yet
    base_ttft = before.get("vllm:time_to_first_token_seconds_count", 0.0)
    base_e2e = before.get("vllm:e2e_request_latency_seconds_count", 0.0)
    i1 = next((i for i, (_, v) in enumerate(polls)
               if v.get("vllm:time_to_first_token_seconds_count", 0.0) - base_ttft >= c), None)
    i2 = None
    for i, (_, v) in enumerate(polls):
        if v.get("vllm:e2e_request_latency_seconds_count", 0.0) - base_e2e > 0:
            break
        i2 = i
    notes = []
    if errors:
        notes.append(f"{len(errors)} request errors: {errors[0]}")
    if i1 is not None and i2 is not None and i2 > i1:
        (t1, a), (t2, b) = polls[i1], polls[i2]
        steps = delta(a, b, "vllm:iteration_tokens_total_count")
        w = t2 - t1
        row["window_s"] = round(w, 3)
        row["steps"] = int(steps)
        if steps:
            row["step_ms"] = round(1000 * w / steps, 4)
            row["tokens_per_step"] = round(delta(a, b, "vllm:iteration_tokens_total_sum") / steps, 3)
        n = delta(a, b, "vllm:inter_token_latency_seconds_count")
        if n:
            row["itl_mean_ms"] = round(1000 * delta(a, b, "vllm:inter_token_latency_seconds_sum") / n, 4)
        g = delta(a, b, "vllm:generation_tokens_total")
        row["output_tok_s"] = round(g / w, 2) if w else ""
        running = [v.get("vllm:num_requests_running", 0.0) for _, v in polls[i1:i2 + 1]]
        row["running_batch"] = round(sum(running) / len(running), 2)
        if steps and row.get("running_batch"):
            row["gen_tokens_per_req_step"] = round(g / steps / row["running_batch"], 4)
        drafts = delta(a, b, "vllm:spec_decode_num_drafts_total")
        dtok = delta(a, b, "vllm:spec_decode_num_draft_tokens_total")
        acc = delta(a, b, "vllm:spec_decode_num_accepted_tokens_total")
        if dtok:
            row["acceptance_rate"] = round(acc / dtok, 5)
        if drafts:
            row["mean_accepted_len"] = round(1 + acc / drafts, 5)
            pp = {p: b["per_pos"].get(p, 0.0) - a["per_pos"].get(p, 0.0) for p in sorted(b["per_pos"], key=int)}
            row["accepted_per_pos"] = " ".join(f"{pp[p] / drafts:.4f}" for p in pp)
        # mean context during the window: prompt plus the tokens emitted by its middle
        mid_tokens = (delta(before, a, "vllm:generation_tokens_total") + g / 2) / max(c, 1)
        row["context_tokens_mid"] = int(args.prompt + mid_tokens)
        if steps < 10:
            notes.append("short window")
    else:
        notes.append("no steady window (not all requests ran at once)")
    # TPOT per request (decode time / (tokens - 1)) over the whole point
    tn = delta(before, after, "vllm:request_time_per_output_token_seconds_count")
    if tn:
        row["tpot_mean_ms"] = round(1000 * delta(before, after, "vllm:request_time_per_output_token_seconds_sum") / tn, 4)
    row["note"] = "; ".join(notes)
    row["_metrics_after"] = text_after
    return row


def append_csv(path: str, fields: list[str], row: dict) -> None:
    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerow({k: row.get(k, "") for k in fields})


def pack_logs(out: str, logdir: str) -> None:
    tmp = os.path.join(out, "logs.tar.gz.tmp")
    with tarfile.open(tmp, "w:gz") as t:
        t.add(logdir, arcname="logs")
    os.replace(tmp, os.path.join(out, "logs.tar.gz"))


def write_models() -> None:
    for d, cfg in ((TARGET_DIR, LLAMA_8B), (DRAFT_DIR, LLAMA_1B)):
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        with open(os.path.join(d, "generation_config.json"), "w") as f:
            json.dump({"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
                       "do_sample": False}, f)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--configs", default="off,draft-k3,table-k3-0,draft-k1,draft-k5,ngram-k3,draft-k2,draft-k4")
    ap.add_argument("--concurrency", default="1,4,16,64,128,256")
    ap.add_argument("--prompt", type=int, default=1000)
    ap.add_argument("--output", type=int, default=200)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.92)
    ap.add_argument("--seed", type=int, default=55)
    ap.add_argument("--cache-root", default="/root/gpuwork/cache")
    ap.add_argument("--logdir", default="/root/gpuwork/logs", help="outside --out: at most 8 files come back")
    ap.add_argument("--deadline-s", type=float, default=540.0, help="stop starting work after this")
    ap.add_argument("--start-limit-s", type=float, default=420.0)
    ap.add_argument("--need-s", type=float, default=150.0, help="time a config needs to be started")
    ap.add_argument("--save-metrics", default="draft-k3,table-k3-0,ngram-k3")
    args = ap.parse_args()

    t_begin = time.monotonic()
    deadline = t_begin + args.deadline_s
    out = args.out
    logdir = args.logdir
    os.makedirs(logdir, exist_ok=True)
    os.makedirs(out, exist_ok=True)
    write_models()
    steps_csv, start_csv = os.path.join(out, "steptime.csv"), os.path.join(out, "startup.csv")
    jsonl = os.path.join(out, "points.jsonl")
    conc = [int(x) for x in args.concurrency.split(",") if x]
    save = set(args.save_metrics.split(","))

    for name in [n for n in args.configs.split(",") if n]:
        spec = CONFIGS[name]
        left = deadline - time.monotonic()
        if left < args.need_s:
            log(f"SKIP {name}: {left:.0f} s left")
            continue
        k = (spec or {}).get("num_speculative_tokens", 0)
        server = Server(name, spec, logdir, args)
        env = cache_env(name, args.cache_root)
        if name in COLD:
            shutil.rmtree(os.path.dirname(env["VLLM_CACHE_ROOT"]), ignore_errors=True)
        cache_was_there = os.path.isdir(env["VLLM_CACHE_ROOT"])
        log(f"START {name}: {' '.join(server.command())}")
        ok, secs = server.start(min(args.start_limit_s, left))
        facts = server.startup_facts()
        if ok:
            try:
                m = re.search(r'num_gpu_blocks="(\d+)"', scrape()[0])
                if m:
                    facts["num_gpu_blocks"] = int(m.group(1))
            except OSError:
                pass
        srow = {"config": name, "spec_config": json.dumps(spec) if spec else "", "ready": ok,
                "seconds_to_ready": round(secs, 2), "max_model_len": args.max_model_len,
                "gpu_memory_utilization": args.gpu_memory_utilization,
                "gpu_mem_used_mib": gpu_mem_used_mib(), **facts,
                "compile_cache": ("empty at start" if name in COLD else
                                  "off's, kept" if name == "off-restart" else "shared with earlier configs")
                + ("" if name in COLD else f" (existed at start: {cache_was_there})")}
        # the capacity vLLM reports in tokens covers target and draft alike; blocks as a fallback
        blocks = (facts["kv_cache_tokens"] // BLOCK if facts.get("kv_cache_tokens") else 0) or facts.get("num_gpu_blocks") or 0
        per_req_blocks = -(-(args.prompt + args.output + k + 1) // BLOCK)
        fit = blocks // per_req_blocks if blocks else 0
        srow["fits_1200_token_requests"] = fit
        log(f"READY={ok} {name} after {secs:.1f} s; {facts}; fits {fit}")
        if not ok:
            tail = open(server.logpath, errors="replace").read().splitlines()[-60:]
            srow["note"] = "did not become ready"
            print("\n".join(tail), flush=True)
            append_csv(start_csv, START_FIELDS, srow)
            server.stop()
            pack_logs(out, logdir)
            if name == "off":
                log("ABORT: the plain engine does not start")
                return 2
            continue
        append_csv(start_csv, START_FIELDS, srow)
        try:
            wc = one_request(prompts(args.seed, 1, args.prompt)[0], 32, 120.0)
            log(f"warm-up request: {wc} tokens")
            if name.endswith("-restart"):
                continue
            for c_req in conc:
                c = c_req if not fit else min(c_req, max(1, fit - 2))
                if c_req > c and c < conc[0]:
                    continue
                left = deadline - time.monotonic()
                est = 3.0 + c * args.prompt / 15000.0 + args.output * 0.012 * (1 + k) * (1 + c / 128)
                if left < est + 5:
                    log(f"SKIP point {name} c={c_req}: {left:.0f} s left, needs about {est:.0f}")
                    break
                row = measure_point(name, spec, c_req, c, args, deadline + 40)
                text = row.pop("_metrics_after")
                if c_req > c:
                    row["note"] = (row["note"] + "; " if row["note"] else "") + f"capped at KV capacity ({fit} requests of {args.prompt + args.output})"
                append_csv(steps_csv, STEP_FIELDS, row)
                with open(jsonl, "a") as f:
                    f.write(json.dumps(row) + "\n")
                log("POINT " + " ".join(f"{key}={row.get(key, '')}" for key in (
                    "config", "concurrency", "running_batch", "steps", "step_ms", "itl_mean_ms",
                    "output_tok_s", "tokens_per_step", "acceptance_rate", "preemptions", "note")))
                with open(os.path.join(logdir, f"metrics-{name}.txt"), "w") as f:
                    f.write(text)
                if c_req > c:
                    break
            if name in save and os.path.exists(os.path.join(logdir, f"metrics-{name}.txt")):
                shutil.copy(os.path.join(logdir, f"metrics-{name}.txt"), os.path.join(out, f"metrics-{name}.txt"))
        except Exception as e:  # noqa: BLE001
            log(f"ERROR in {name}: {e!r}")
            print("\n".join(open(server.logpath, errors="replace").read().splitlines()[-40:]), flush=True)
        finally:
            server.stop()
            pack_logs(out, logdir)
            log(f"STOPPED {name}; {deadline - time.monotonic():.0f} s left")
    return 0


if __name__ == "__main__":
    sys.exit(main())
