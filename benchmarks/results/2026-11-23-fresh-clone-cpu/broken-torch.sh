#!/usr/bin/env bash
# In the fresh clone's environment: a +cpu torch of another release replaces vLLM's
# (as pip's configured wheel folder supplied it), `check` reports it, its printed
# command is run as written, and `check` runs again.
set -u
export PATH=$VENV/bin:$PATH
echo "\$ pip install --no-deps <local wheel folder>/$(basename "$CPU_WHEEL")"
pip install -q --no-deps "$CPU_WHEEL" 2>&1 | grep -v "^WARNING: Location"
echo
echo "\$ vllm-pp-cudagraph check   (stdout; vLLM's log lines went to stderr)"
vllm-pp-cudagraph check > check.out 2>/dev/null
rc=$?
cat check.out; echo "[exit $rc]"; echo
fix=$(grep -A1 '^imports: BROKEN' check.out | tail -1 | sed 's/^ *//')
echo "\$ $fix"
start=$SECONDS
eval "$fix" > fix.log 2>&1
rc=$?
grep -E "^Successfully|incompatible|ERROR" fix.log
echo "[exit $rc, $((SECONDS - start)) s]"; echo
echo "\$ vllm-pp-cudagraph check"
vllm-pp-cudagraph check 2>/dev/null | grep -E "^(vLLM|torch|imports|GPUs)"
echo "[exit ${PIPESTATUS[0]}]"
