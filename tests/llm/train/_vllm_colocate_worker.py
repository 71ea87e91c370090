"""Run by tests/llm/base/test_vllm.py in a subprocess: two steps of TRL's GRPOTrainer (TiltGRPOTrainer) with
``use_vllm=True, vllm_mode="colocate"`` on CPU, then checks written to ``<out>/report.json``:

* the (name, tensor) pairs TRL's sync walks are the policy's parameters minus the log Z head;
* after a final sync, vLLM's processed log-probs of its own samples equal the trained policy's
  (transformers, teacher forcing, and the trainer's own scoring path at its precision) and differ from
  the initial model's: the weights really moved;
* the prefix cache does not outlive a sync: a prompt longer than one KV block, generated from twice
  under the initial weights (the second run reads cached blocks), is generated from after the trained
  weights are pushed with the trained policy's log-probs (no cached block of the old weights is read);
* (flowrl) the head is in the saved checkpoint and a fresh policy + head restores it exactly.

The engine is built as a user's ``tiltlab llm train`` builds it: TiltGRPOTrainer adapts TRL's colocated
``LLM`` to the CPU (eager, KV cache in bytes, chunked prefill off, the policy's dtype); the worker only
sets the KV cache size (``vllm_kv_cache_memory_bytes``) and checks the engine got those settings.
"""

import json
import sys
from pathlib import Path

import torch
from _tiny_trainer import disa_kwargs, online_args
from _tiny_trainer import parity_reward as reward


def teacher_forced(model, prompt_ids, completion_ids):
    from tiltlab.llm.base.rollout import processed_logprobs

    ids = torch.tensor([list(prompt_ids) + list(completion_ids[:-1])])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 :]
    return processed_logprobs(logits).gather(-1, torch.tensor(completion_ids)[:, None]).squeeze(-1).double()


def main(tiny_dir: str, out_dir: str, objective: str) -> None:
    from datasets import Dataset
    from safetensors.torch import load_file
    from vllm import SamplingParams

    from tiltlab.llm.base.models import load_model, load_tokenizer
    from tiltlab.llm.base.tasks import arithmetic_tasks
    from tiltlab.llm.disa.logz_head import attach_log_z_head, get_log_z_head, is_log_z_head_param
    from tiltlab.llm.train.online import TiltGRPOTrainer

    rows = [
        {"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]}
        for r in arithmetic_tasks(12, seed=0)
    ]
    extra = {}
    if objective == "disa":
        extra = disa_kwargs()
        for i, r in enumerate(rows):
            r["log_z"] = 0.1 * i
    out = Path(out_dir)
    args = online_args(
        out,
        objective,
        learning_rate=5e-2,
        max_steps=2,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_kv_cache_memory_bytes=32 << 20,
        **extra,
    )
    initial = load_model(tiny_dir, device="cpu").eval()
    tr = TiltGRPOTrainer(
        model=load_model(tiny_dir, device="cpu"),
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=load_tokenizer(tiny_dir),
    )
    tr.train()
    losses = [h["loss"] for h in tr.state.log_history if "loss" in h and "train_loss" not in h]
    gen = tr.vllm_generation
    import trl.generation.vllm_generation as vg
    from vllm import LLM

    engine = gen.llm.llm_engine
    rep_engine = {
        "llm_restored": vg.LLM is LLM,  # the CPU adaptation is scoped to the trainer's construction
        "enforce_eager": engine.model_config.enforce_eager,
        "dtype": str(engine.model_config.dtype),
        "kv_cache_memory_bytes": engine.vllm_config.cache_config.kv_cache_memory_bytes,
        "chunked_prefill": engine.vllm_config.scheduler_config.enable_chunked_prefill,
    }
    sent = [name for name, _ in gen._iter_named_params()]
    policy = [name for name, _ in tr.model.named_parameters()]
    # prefix cache across a sync: push the INITIAL weights, generate twice from a prompt longer than one
    # KV block (the second run reads the first's cached blocks: caching is on), then push the trained
    # weights and generate again: the log-probs must be the trained policy's, not ones computed on prompt
    # blocks cached under the initial weights (the sync resets the prefix cache after the reload)
    cache = engine.vllm_config.cache_config
    block = int(cache.block_size)
    digits = " ".join(str(i % 10) for i in range(4 * block))
    long_prompt = tr.processing_class(digits, add_special_tokens=False)["input_ids"][: block + 16]
    sp_long = SamplingParams(n=1, temperature=1.0, max_tokens=6, logprobs=0, seed=9)
    walk = gen._iter_named_params
    gen._iter_named_params = lambda: ((n, p.data) for n, p in initial.named_parameters())
    gen.sync_weights()
    gen._iter_named_params = walk
    first = gen.llm.generate([{"prompt_token_ids": long_prompt}], sp_long, use_tqdm=False)[0]
    repeat = gen.llm.generate([{"prompt_token_ids": long_prompt}], sp_long, use_tqdm=False)[0]
    gen.sync_weights()  # push the final weights (TRL syncs before each generation step, not after the last)
    after = gen.llm.generate([{"prompt_token_ids": long_prompt}], sp_long, use_tqdm=False)[0]
    prompt = tr.processing_class("12 + 7 =", add_special_tokens=False)["input_ids"]
    sp = SamplingParams(n=4, temperature=1.0, max_tokens=8, logprobs=0, seed=5)
    comp = gen.llm.generate([{"prompt_token_ids": prompt}], sp, use_tqdm=False)[0].outputs
    tr.model.eval()
    d_trained, d_trainer_path, d_initial = [], [], []
    for c in comp:
        ids = list(c.token_ids)
        got = torch.tensor([step[t].logprob for step, t in zip(c.logprobs, ids)], dtype=torch.float64)
        d_trained.append((got - teacher_forced(tr.model, prompt, ids)).abs().max())
        d_initial.append((got - teacher_forced(initial, prompt, ids)).abs().max())
        # the trainer's own scoring path (TRL's fused head under the trainer's autocast): what the IS ratio uses
        seq = torch.tensor([list(prompt) + ids])
        with torch.no_grad():
            own = tr._get_per_token_logps_and_entropies(tr.model, seq, torch.ones_like(seq), len(ids))[0][0]
        d_trainer_path.append((got - own.double()).abs().max())

    def long_diff(out, model):
        c = out.outputs[0]
        ids = list(c.token_ids)
        got = torch.tensor([step[t].logprob for step, t in zip(c.logprobs, ids)], dtype=torch.float64)
        return float((got - teacher_forced(model, long_prompt, ids)).abs().max())

    rep_cache = {
        "prefix_caching": bool(cache.enable_prefix_caching),
        "block_size": block,
        "long_prompt_tokens": len(long_prompt),
        "cached_tokens_repeat": int(repeat.num_cached_tokens or 0),
        "cached_tokens_after_sync": int(after.num_cached_tokens or 0),
        # same 1e-4 as below: vLLM scored with the weights last pushed, prompt blocks included
        "long_before_sync_diff_initial": long_diff(first, initial),
        "long_after_sync_diff_trained": long_diff(after, tr.model.eval()),
        "long_after_sync_diff_initial": long_diff(after, initial),
    }
    rep = {
        **rep_engine,
        **rep_cache,
        "steps": tr.state.global_step,
        "losses": losses,
        "sent_names_ok": sent == [n for n in policy if not is_log_z_head_param(n)],
        # fp32 on both sides (the trainer too: no bf16 autocast on CPU with vLLM, vllm_sync.cpu_trainer_bf16);
        # only the kernels' summation orders differ (vLLM's packed CPU GEMMs vs ATen): measured 5e-7 here,
        # 5e-5 on SmolLM2-135M, while the trainer under bf16 autocast (accelerate wraps the policy's forward,
        # so both comparisons see it) is off by 4e-3 here and by 0.1-0.5 on SmolLM2, and stale layers by
        # >= 0.5. The sync is right when vLLM is within 1e-4 of the trained policy, by a plain forward and
        # by the trainer's own scoring path, AND 10x closer to it than to the initial weights.
        "vllm_matches_policy": bool(
            max(d_trained) < 1e-4 and max(d_trainer_path) < 1e-4 and 10 * max(d_trained) < max(d_initial)
        ),
        "policy_changed": bool(max(d_initial) > 1e-1),
        "max_diff_trained": float(max(d_trained)),
        "max_diff_trainer_path": float(max(d_trainer_path)),
        "max_diff_initial": float(max(d_initial)),
        "mixed_precision": str(tr.accelerator.mixed_precision),
    }
    head = get_log_z_head(tr.model, required=False)
    rep["head_params"] = 0 if head is None else sum(p.numel() for p in head.parameters())
    if head is not None:
        tr.save_model(str(out / "final"))
        state = load_file(str(out / "final" / "model.safetensors"))
        rep["head_in_checkpoint"] = any(is_log_z_head_param(k) for k in state)
        fresh = load_model(tiny_dir, device="cpu")
        attach_log_z_head(fresh, args.log_z_hidden, args.log_z_layers, args.log_z_dropout)
        missing, _ = fresh.load_state_dict(state, strict=False)
        new_head = get_log_z_head(fresh)
        rep["head_restored"] = not [k for k in missing if is_log_z_head_param(k)] and all(
            torch.equal(a, b) for a, b in zip(head.state_dict().values(), new_head.state_dict().values())
        )
    (out / "report.json").write_text(json.dumps(rep))
    print(json.dumps(rep))


if __name__ == "__main__":
    main(*sys.argv[1:4])
