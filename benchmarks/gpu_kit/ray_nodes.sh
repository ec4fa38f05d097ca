#!/usr/bin/env bash
# Two Ray nodes on one host, one GPU each, for PP across nodes without a second host:
# the head node owns GPU 0, a second node GPU 1, each its own raylet and object store.
# vLLM's Ray executor then places each pipeline stage on a node of its own and starts
# its worker from the driver's environment as vLLM copies it (the plugin's settings
# included: tests/unit/test_ray_env.py). Ray must be installed (../install_ray.sh).
#
#   bash benchmarks/gpu_kit/ray_nodes.sh start   # prints the RAY_ADDRESS to export
#   bash benchmarks/gpu_kit/ray_nodes.sh stop
#
# env: RAY_PORT (default 6379); RAY_SECOND_NODE_PYTHONPATH: the second node's PYTHONPATH
# (default this one's), e.g. a site without the plugin's package, to see what a user sees
# when one node lacks it (run_checks.sh step ray-pp2).
set -euo pipefail
port=${RAY_PORT:-6379}
# install_ray.sh installs Ray into the kit's site, where its command may not be on PATH.
command -v ray >/dev/null || ray() {
  python3 -c 'import sys; from ray.scripts.scripts import main; sys.argv[0] = "ray"; sys.exit(main())' "$@"
}
case ${1:-} in
  start)
    CUDA_VISIBLE_DEVICES=0 ray start --head --port "$port" --num-gpus 1 --disable-usage-stats
    CUDA_VISIBLE_DEVICES=1 PYTHONPATH=${RAY_SECOND_NODE_PYTHONPATH:-${PYTHONPATH:-}} ray start --address "127.0.0.1:$port" --num-gpus 1
    ray status
    echo "export RAY_ADDRESS=127.0.0.1:$port" ;;
  stop)
    ray stop --force ;;
  *)
    echo "usage: ray_nodes.sh start|stop" >&2; exit 2 ;;
esac
