#!/usr/bin/env bash
# Tests of the `flashattn` tool (registered with ctest as cli_*): exit codes, messages
# naming the bad flag, library errors, check PASS over the option matrix on the CPU
# backend (group bias_varlen: bias tensors with every broadcast and packed varlen
# batches), bench output files, and (group cuda, only when asked) the CUDA backend.
# usage: test_cli.sh <path of flashattn> [all|usage|check|bias_varlen|bench|cuda]
set -uo pipefail
tool="$1"
group="${2:-all}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# expect <exit code> <extended regex on stdout+stderr> args...
expect() {
  local code="$1" re="$2"
  shift 2
  local out rc
  out="$("$tool" "$@" 2>&1)"
  rc=$?
  if [[ $rc -ne $code ]]; then fail "flashattn $* exited $rc, expected $code"$'\n'"$out"; return; fi
  if ! grep -Eq -e "$re" <<<"$out"; then fail "flashattn $*: output does not match /$re/"$'\n'"$out"; return; fi
  echo "ok: flashattn $*"
}

if [[ $group == all || $group == usage ]]; then
  expect 0 "^usage: flashattn <command>" --help
  expect 2 "^usage: flashattn <command>"
  expect 0 "^flashattn [0-9]+\.[0-9]+\.[0-9]+ \(library [0-9]+\.[0-9]+\.[0-9]+\)" --version
  expect 2 "unknown command 'frob'" frob
  for c in info check bench; do expect 0 "^usage: flashattn $c" "$c" --help; done
  expect 2 "--batch=0 must be >= 1" check --batch 0
  expect 2 "--seqlen-q: 'x' is not an integer" check --seqlen-q x
  expect 2 "--dtype: 'fp8' is not one of fp16\|bf16\|fp32" check --dtype fp8
  expect 2 "--causal: 'diag' is not one of" check --causal=diag
  expect 2 "--window: '5' is not L,R" check --window 5
  expect 2 "right window 4 contradicts --causal" check --causal --window 3,4
  expect 2 "--dropout=1 must be < 1" check --dropout 1
  expect 2 "--block-sparse=0 must be > 0" check --block-sparse 0
  expect 2 "--alibi=x: the only value is 'symmetric'" check --alibi=x
  expect 2 "unknown option '--frob'" check --frob
  expect 2 "option --batch needs a value" check --batch
  expect 2 "option --bwd takes no value" check --bwd=1
  expect 2 "option --batch given more than once" check --batch 1 --batch 2
  expect 2 "unexpected argument 'x'" check x
  expect 2 "--bias-tensor: 'head' in 'head' is not one of full\|batch-broadcast" check --bias-tensor head
  expect 2 "--bias-tensor: 'key-broadcast' given twice" check --bias-tensor key-broadcast,query-broadcast,key-broadcast
  expect 2 "--bias-tensor cannot be combined with --alibi" check --bias-tensor full --alibi
  expect 2 "option --bias-tensor needs a value" check --bias-tensor
  expect 2 "--varlen: 'x' in '4,x' is not LEN or LEN_Q:LEN_K" check --varlen 4,x
  expect 2 "--varlen: '3:-1' in '2,3:-1' has a negative length" check --varlen 2,3:-1
  expect 2 "--varlen: '' in '4,,5' is not LEN" check --varlen 4,,5
  expect 2 "--varlen 2000000000,2000000000: more than 2\^31-1 tokens" check --varlen 2000000000,2000000000
  expect 2 "--batch=3 contradicts --varlen 1,2 \(2 sequences\)" check --batch 3 --varlen 1,2
  expect 2 "--seqlen-k=20 is less than the longest --varlen key length 30" check --varlen 5:30 --seqlen-k 20
  expect 2 "--seqlens: 'x' in '512,x' is not an integer" bench --backend cpu --seqlens 512,x
  expect 2 "--isolate .* needs --backend cpu" bench --isolate
  expect 2 "--algorithm: 'fast' is not one of flash\|standard\|both" bench --backend cpu --algorithm fast
  # Errors the library reports: exit 3 with the status name and the library's message.
  expect 3 "FLASHATTN_STATUS_INVALID_HEADS: .*heads_q=6" check --backend cpu --heads-q 6 --heads-kv 4
  expect 3 "FLASHATTN_STATUS_INVALID_SHAPE: .*head_dim_qk=300" check --backend cpu --head-dim 300
  # The library judges the configuration before the tool allocates anything it sizes: with
  # the address space limited to 1 GiB, a batch one past the library's maximum is the
  # library's error, not an attempt at gigabytes of per-sequence offsets and tensors.
  printf '#!/usr/bin/env bash\nulimit -v 1048576\nexec "%s" "$@"\n' "$tool" >"$tmp/limited"
  chmod +x "$tmp/limited"
  unlimited_tool="$tool"
  tool="$tmp/limited"
  expect 3 "FLASHATTN_STATUS_INVALID_SHAPE: .*batch=2147483649" check --backend cpu --batch 2147483649 --seqlen-q 1 --heads-q 1 --head-dim 8
  expect 3 "FLASHATTN_STATUS_INVALID_SHAPE: .*seqlen_q=4294967296" check --backend cpu --batch 1 --seqlen-q 4294967296 --seqlen-k 4294967296 --heads-q 1 --head-dim 8 --block-sparse 0.5
  tool="$unlimited_tool"
  expect 0 "^libflashattn [0-9.]+ \(runtime" info --no-probe
fi

if [[ $group == all || $group == check ]]; then
  base=(check --backend cpu --bwd --batch 2 --heads-q 4)
  odd="--seqlen-q 97 --seqlen-k 161 --head-dim 40"
  while IFS= read -r opts; do
    opts="${opts//\$odd/$odd}"
    # shellcheck disable=SC2086
    expect 0 "^PASS$" "${base[@]}" $opts
  done <<'OPTS'
$odd --dtype fp32
$odd --dtype fp16 --causal
$odd --dtype bf16 --causal=bottom-right
$odd --dtype fp16 --window 16,8 --align bottom-right
$odd --dtype fp32 --softcap 2.5 --alibi
$odd --dtype fp16 --alibi=symmetric --causal=bottom-right
$odd --dtype fp16 --dropout 0.25 --seed 11
--dtype fp32 --block-sparse 0.5 --seqlen-q 300 --seqlen-k 400
$odd --dtype fp16 --heads-kv 1 --head-dim-v 24 --layout bhsd
$odd --dtype bf16 --heads-kv 2 --algorithm standard --causal --dropout 0.1
--dtype fp16 --seqlen-q 1 --seqlen-k 1 --head-dim 1
OPTS
fi

if [[ $group == all || $group == bias_varlen ]]; then
  # Bias tensors (every broadcast pattern; dBias checked with --bwd) and packed varlen
  # batches with empty sequences, alone and with the other options.
  base=(check --backend cpu --bwd --heads-q 4)
  odd="--batch 2 --seqlen-q 97 --seqlen-k 161 --head-dim 40"
  while IFS= read -r opts; do
    opts="${opts//\$odd/$odd}"
    # shellcheck disable=SC2086
    expect 0 "^PASS$" "${base[@]}" $opts
  done <<'OPTS'
$odd --dtype fp32 --bias-tensor full
$odd --dtype fp16 --bias-tensor batch-broadcast,head-broadcast --causal
$odd --dtype bf16 --bias-tensor query-broadcast --window 20,5 --align bottom-right --layout bhsd
$odd --dtype fp16 --bias-tensor key-broadcast --dropout 0.2 --seed 3 --heads-kv 2
$odd --dtype fp32 --bias-tensor head-broadcast,query-broadcast --softcap 4 --head-dim-v 24 --algorithm standard
--dtype fp32 --head-dim 40 --varlen 37,0,64:100,1:0,0:5
--dtype bf16 --head-dim 32 --varlen 50:20,0,20:90 --causal=bottom-right --heads-kv 1 --layout bhsd
--dtype fp16 --head-dim 24 --varlen 130:70,9,0:3 --alibi=symmetric --softcap 5 --dropout 0.1 --seed 7
--dtype fp32 --head-dim 16 --varlen 150:200,0:40,200:130 --block-sparse 0.6 --seed 2
--dtype fp16 --head-dim 40 --varlen 30,7:45 --seqlen-q 64 --seqlen-k 80 --bias-tensor full
--dtype fp32 --head-dim 40 --varlen 25:60,0,60:25 --bias-tensor batch-broadcast,key-broadcast --window 8,8
--dtype fp16 --head-dim 8 --varlen 0,0:4,3:0
OPTS
  # The reported configuration names the packed lengths and the bias broadcast.
  expect 0 "varlen: 3:3,0:5 \(total_q=3 total_k=8" check --backend cpu --head-dim 8 --varlen 3,0:5
  expect 0 "bias-tensor=broadcast\(batch,query\)" check --backend cpu --head-dim 8 --seqlen-q 16 \
    --bias-tensor query-broadcast,batch-broadcast
fi

if [[ $group == all || $group == bench ]]; then
  expect 0 "^cpu +flash +fp32 +128 +2 +2 +32 .* bwd" bench --backend cpu --seqlens 64,128 --tokens 256 --heads 2 \
    --head-dim 32 --algorithm both --bwd --repeats 1 --warmup 0 --csv "$tmp/b.csv" --json "$tmp/b.json"
  rows=$(($(wc -l <"$tmp/b.csv") - 1))
  [[ $rows -eq 8 ]] && echo "ok: bench.csv has 8 rows" || fail "bench.csv has $rows rows, expected 8"
  if command -v python3 >/dev/null; then
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); r=d['rows']; assert len(r)==8 and all(x['error'] is None and x['ms_median']>0 for x in r), r" "$tmp/b.json" \
      && echo "ok: bench.json parses, 8 rows without errors" || fail "bench.json"
  fi
  expect 0 "rss_peak\(MiB\)" bench --backend cpu --seqlens 64 --tokens 64 --heads 1 --head-dim 16 --isolate --repeats 1 --warmup 0
fi

if [[ $group == cuda ]]; then
  # The CUDA backend against the fp64 reference, the CPU backend and the other algorithm.
  if ! "$tool" info --no-probe | grep -Eq '^cuda devices +[1-9]'; then
    echo "CLI_CUDA_SKIPPED: no CUDA device (or a CPU-only build)"
    exit 0
  fi
  small=(check --backend cuda --bwd --batch 2 --heads-q 8 --seqlen-q 257 --seqlen-k 391)
  expect 0 "^PASS$" "${small[@]}" --dtype bf16 --head-dim 128 --causal=bottom-right
  expect 0 "^PASS$" "${small[@]}" --dtype fp16 --head-dim 64 --heads-kv 2 --window 64,16
  expect 0 "^PASS$" "${small[@]}" --dtype fp16 --head-dim 96 --alibi --softcap 20 --dropout 0.1 --seed 5
  expect 0 "^PASS$" "${small[@]}" --dtype bf16 --head-dim 64 --block-sparse 0.5 --layout bhsd
  expect 0 "^PASS$" "${small[@]}" --dtype fp32 --head-dim 32 --algorithm standard --causal
  # Bias tensors (with dBias) and varlen with an empty sequence on the device.
  expect 0 "^PASS$" check --backend cuda --bwd --heads-q 4 --heads-kv 2 --dtype bf16 --head-dim 64 \
    --varlen 300:200,0,130:260 --bias-tensor head-broadcast
  expect 0 "^PASS$" check --backend cuda --bwd --heads-q 2 --dtype fp16 --head-dim 128 \
    --varlen 77,0:40,190 --bias-tensor full --causal=bottom-right --dropout 0.1 --seed 9
  expect 0 "TFLOP/s" bench --backend cuda --seqlens 512,1024 --tokens 2048 --head-dim 64 --algorithm both --bwd \
    --repeats 3 --warmup 1
  # Loading cuBLAS (docs/concepts.md, "Environment variables"): a relative
  # FLASHATTN_CUBLAS_PATH is refused, an absolute one is used, and without it the
  # nvidia-cublas wheel layout beside a copy of the library is found first (LD_DEBUG=files
  # names the file dlopen loaded).
  std=(check --backend cuda --algorithm standard --batch 1 --heads-q 2 --seqlen-q 64 --head-dim 64 --dtype fp16)
  FLASHATTN_CUBLAS_PATH=libcublas.so expect 3 \
    "FLASHATTN_STATUS_LIBRARY_UNAVAILABLE: .*FLASHATTN_CUBLAS_PATH=libcublas.so is not an absolute path" "${std[@]}"
  cublas_dir=""
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    compgen -G "$d/libcublas.so.[0-9]*" >/dev/null && { cublas_dir="$d"; break; }
  done
  if [[ -z $cublas_dir ]]; then
    fail "no libcublas.so.N under /usr/local/cuda to test FLASHATTN_CUBLAS_PATH with"
  else
    real=$(compgen -G "$cublas_dir/libcublas.so.[0-9]*" | head -1)
    FLASHATTN_CUBLAS_PATH="$real" expect 0 "^PASS$" "${std[@]}"
    mkdir -p "$tmp/site/nvidia/cublas/lib" "$tmp/site/flashattn"
    ln -s "$cublas_dir"/libcublas.so.* "$cublas_dir"/libcublasLt.so.* "$tmp/site/nvidia/cublas/lib/"
    lib=$(ldd "$tool" | awk '/libflashattn\.so/ {print $3}')
    cp "$lib" "$tmp/site/flashattn/"
    LD_LIBRARY_PATH="$tmp/site/flashattn" LD_DEBUG=files expect 0 \
      "file=$tmp/site/flashattn/\.\./nvidia/cublas/lib/libcublas\.so\.[0-9]+ .*dynamically loaded" "${std[@]}"
  fi
fi

[[ $failures -eq 0 ]] && echo "all CLI tests passed" || echo "$failures CLI test(s) failed"
[[ $failures -eq 0 ]]
