# Correctness on the GPU (issue 17): nvFuser property tests in bf16/fp16/fp32, the CUDA tests of the guard,
# the OpInfo corpus on nvFuser in bf16 and fp16, and this GPU's cost constants. Writes into $OUT; < 10 min.
# Run from the repo root after `source .gpu/setup.sh`.
set -x
export TFG_ROUNDING_EXAMPLES=${TFG_ROUNDING_EXAMPLES:-60}
python3 -m pytest -q -p no:logging -m cuda --hypothesis-show-statistics tests/test_rounding.py tests/test_compile_options.py \
  tests/test_nvfuser.py tests/test_inplace.py tests/test_rewrites.py 2>&1 | grep -v -i warn > $OUT/cuda_tests.txt; tail -25 $OUT/cuda_tests.txt
python3 -m thunder_fusion_guard calibrate --device cuda > $OUT/calibration.txt 2>&1; tail -15 $OUT/calibration.txt
TFG_OPINFO_DTYPES=${TFG_OPINFO_DTYPES:-bfloat16,float16} TFG_COVERAGE_JSON=$OUT/opinfo_cuda_lowp.json \
  timeout -s INT $((570 - SECONDS)) python3 -m pytest -q -p no:logging -m cuda tests/test_opinfo_diff.py 2>&1 \
  | grep -v -i warn | tail -40 > $OUT/opinfo_cuda_lowp.txt; tail -14 $OUT/opinfo_cuda_lowp.txt
