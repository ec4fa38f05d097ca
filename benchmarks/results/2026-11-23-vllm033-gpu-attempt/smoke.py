import json, os, sys, tempfile, time
import torch, vllm
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
from vllm_pp_cudagraph.bench.dummy_model import write_model_dir

def main():
    print("vllm", vllm.__version__, "torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0), flush=True)
    model = str(write_model_dir(tempfile.mkdtemp(), "qwen3-0.6b", weights=True))
    prompts = [TokensPrompt(prompt_token_ids=[1000 + 7 * i + j for j in range(8)]) for i in range(8)]
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    out = {}
    for mode in sys.argv[1:]:
        kw = {"enforce_eager": True} if mode == "eager" else {"compilation_config": {"cudagraph_mode": mode.upper()}}
        t = time.monotonic()
        llm = LLM(model=model, skip_tokenizer_init=True, gpu_memory_utilization=0.4, attention_backend="TRITON_ATTN",
                  max_model_len=512, max_num_seqs=16, **kw)
        init = time.monotonic() - t
        t = time.monotonic()
        res = llm.generate(prompts, params)
        toks = [list(r.outputs[0].token_ids) for r in res]
        out[mode] = {"init_s": round(init, 1), "gen_s": round(time.monotonic() - t, 2), "tokens": toks}
        print("RESULT", mode, json.dumps(out[mode])[:300], flush=True)
        del llm
        import gc; gc.collect(); torch.cuda.empty_cache()
    modes = list(out)
    print("SAME_TOKENS", {m: out[m]["tokens"] == out[modes[0]]["tokens"] for m in modes}, flush=True)
    json.dump({"vllm": vllm.__version__, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "runs": out},
              open(os.path.join(os.environ.get("OUT", "."), "smoke33.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
