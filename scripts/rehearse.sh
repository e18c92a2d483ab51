#!/usr/bin/env bash
# Deploy into an emulator, then use the stack as a user would (docs/AWS.md, "The rehearsal"):
#   1. synthesise the CDK app (as `npx cdk synth` does; offline, no Docker);
#   2. create the template as a stack in moto's CloudFormation on a local server, with IAM
#      enforced; for each resource type moto cannot create it says what stands in
#      (tests/helpers/moto_stack.py); the functions run as local processes, each under its
#      own role's credentials, played by a small invoker behind moto's Lambda;
#   3. `ebb submit` a small job, `ebb watch` it, `ebb report` it, against the stack's outputs.
# Prints each step; exits non-zero on any failure, including any request IAM refused.
#
#   bash scripts/rehearse.sh                     # synthesise the app as it is
#   bash scripts/rehearse.sh --template FILE     # rehearse an already synthesised template
set -euo pipefail
cd "$(dirname "$0")/.."

template=""
while [ $# -gt 0 ]; do
  case "$1" in
    --template) template=${2:?--template needs a file}; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "rehearse.sh: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
done

[ -x .venv/bin/python ] || bash scripts/setup.sh
python=.venv/bin/python
export PATH="$PWD/.venv/bin:$PATH" JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=20
work=$(mktemp -d "${TMPDIR:-/tmp}/ebb-rehearsal.XXXXXX")
server=""
cleanup() {
  if [ -n "$server" ] && kill -0 "$server" 2>/dev/null; then kill "$server"; wait "$server" || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

if [ -n "$template" ] && [ ! -f "$template" ]; then
  echo "rehearse.sh: --template $template: no such file" >&2; exit 2
fi
if [ -z "$template" ]; then
  echo "==> 1. synthesising the CDK app (cdk.json's context, environment-agnostic)"
  CDK_OUTDIR="$work/cdk.out" "$python" app.py
  template="$work/cdk.out/Ebb.template.json"
else
  echo "==> 1. rehearsing $template"
fi

echo "==> 2. creating the stack in moto's CloudFormation (IAM enforced)"
"$python" tests/helpers/moto_stack.py serve "$template" "$work/state.json" > "$work/server.log" 2>&1 &
server=$!
for _ in $(seq 600); do
  [ -s "$work/state.json" ] && break
  kill -0 "$server" 2>/dev/null || { cat "$work/server.log" >&2; echo "rehearse.sh: the emulator did not start" >&2; exit 1; }
  sleep 0.2
done
[ -s "$work/state.json" ] || { cat "$work/server.log" >&2; echo "rehearse.sh: the emulator is not ready after 120 s" >&2; exit 1; }
sed 's/^/    /' "$work/server.log"

# The user's environment: the emulator's endpoint, its administrator's keys, its region.
# Nothing of this machine's own AWS configuration leaks in.
for var in $(env | grep -o '^AWS_[A-Z_]*' || true); do unset "$var"; done
eval "$("$python" -c '
import json, shlex, sys
s = json.load(open(sys.argv[1]))
for k, v in (("AWS_ENDPOINT_URL", s["endpoint"]), ("AWS_REGION", s["region"]), ("AWS_DEFAULT_REGION", s["region"]),
             ("AWS_ACCESS_KEY_ID", s["AWS_ACCESS_KEY_ID"]), ("AWS_SECRET_ACCESS_KEY", s["AWS_SECRET_ACCESS_KEY"]),
             ("EBB_STACK", s["stack"])):
    print(f"export {k}={shlex.quote(v)}")
' "$work/state.json")"
export AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null AWS_EC2_METADATA_DISABLED=true

echo "==> 3. a small job: planted ratings, prepared here, 2 workers"
ebb synth ratings --out "$work/ratings.csv" --users 300 --items 200 --ratings 12000 --rank 5 --seed 1 >/dev/null 2>&1
ebb prepare --format movielens --input "$work/ratings.csv" --out "$work/ratings" --batch-size 1000 >/dev/null 2>&1
cat > "$work/job.yaml" <<EOF
name: rehearsal
model: pmf
data: $work/ratings
workers: 2
seed: 3
hyper: {rank: 4}
scaling: {policy: none}
stop: {max_epochs: 0.8}
EOF

echo "==> ebb submit"
submitted=$(ebb submit "$work/job.yaml" 2>&1)
echo "$submitted" | sed 's/^/    /'
execution=$(echo "$submitted" | grep -m1 ':execution:' | tr -d ' ')

status=0
echo "==> ebb watch"
ebb watch "$execution" --every 1 > "$work/watch.log" 2>&1 || status=$?
sed 's/^/    /' "$work/watch.log"

echo "==> ebb report"
ebb report "$execution" --out "$work/report" > "$work/report.log" 2>&1 || status=1
sed 's/^/    /' "$work/report.log"

kill "$server"
server_status=0
wait "$server" || server_status=$?
server=""
tail -n +2 "$work/server.log" | grep -v '^  AWS::\|^  Custom::' | sed 's/^/    /'
if [ "$status" != 0 ] || [ "$server_status" != 0 ]; then
  echo "rehearse.sh: FAILED (job exit $status, emulator exit $server_status)" >&2
  exit 1
fi
echo "==> rehearsal passed: the stack was created, the job SUCCEEDED, its report is above"
