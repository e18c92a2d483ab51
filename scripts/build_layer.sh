#!/usr/bin/env bash
# Stage the Lambda layer of the zip functions (validate, on_failure) in layers/common/python:
# the wheels of layers/requirements-common.txt for the Python and the wheel platforms of the
# functions' base image (lambda_src/Dockerfile's FROM, read by stacks/image.py), fetched
# with pip for that platform whatever this machine is (no Docker). `cdk synth` refuses to
# run without it. Idempotent: does nothing when layers/common was staged from the same
# requirements for the same architecture.
#
#   bash scripts/build_layer.sh              # x86_64 (the default ebb:architecture)
#   bash scripts/build_layer.sh --arch arm64 # for -c ebb:architecture=arm64
#   bash scripts/build_layer.sh --force      # restage even if up to date
set -euo pipefail
cd "$(dirname "$0")/.."

arch=x86_64
force=0
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch=${2:?--arch needs x86_64 or arm64}; shift 2 ;;
    --force) force=1; shift ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build_layer.sh: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
done
case "$arch" in
  x86_64|arm64) ;;
  *) echo "build_layer.sh: --arch must be x86_64 or arm64, got $arch" >&2; exit 2 ;;
esac

requirements=layers/requirements-common.txt
out=layers/common
stamp=$out/.ebb-layer.json
python=.venv/bin/python
[ -x "$python" ] || python=python3
base=$("$python" -m stacks.image --arch "$arch")  # line 1: the Python version; line 2: the platforms
py_version=$(echo "$base" | sed -n 1p)
platforms=$(echo "$base" | sed -n 2p)
platform_args=()
for p in $platforms; do platform_args+=(--platform "$p"); done
digest=$(sha256sum < "$requirements" | cut -d" " -f1)
want="{\"architecture\": \"$arch\", \"platform\": \"${platforms%% *}\", \"python\": \"$py_version\", \"requirements_sha256\": \"$digest\"}"

if [ "$force" = 0 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -d "$out/python" ]; then
  echo "==> Lambda layer $out is up to date ($arch)"
  exit 0
fi

echo "==> staging the Lambda layer $out for $arch (pip, ${platforms%% *}, Python $py_version)"
staging=$(mktemp -d layers/.common.XXXXXX)
trap 'rm -rf "$staging"' EXIT
"$python" -m pip install --quiet --disable-pip-version-check --no-compile \
    "${platform_args[@]}" --only-binary=:all: --python-version "$py_version" --implementation cp \
    --target "$staging/python" -r "$requirements" 2>&1 \
  | { grep -v "is ignored: it is neither a file nor a directory" || true; }
[ "${PIPESTATUS[0]}" = 0 ] || { echo "build_layer.sh: pip failed" >&2; exit 1; }
# The runtime ships boto3 and its dependencies (aws-xray-sdk pulls botocore in):
# a second copy would only shadow the runtime's and add 20 MB.
(cd "$staging/python" && rm -rf boto3 boto3-* botocore botocore-* s3transfer s3transfer-* \
    urllib3 urllib3-* dateutil python_dateutil-* six.py six-* jmespath jmespath-* bin)
find "$staging/python" -name __pycache__ -type d -prune -exec rm -rf {} +
echo "$want" > "$staging/.ebb-layer.json"
rm -rf "$out"
mv "$staging" "$out"
trap - EXIT
echo "    $(du -sh "$out" | cut -f1) in $out"
