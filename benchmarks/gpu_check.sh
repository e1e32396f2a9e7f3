set -x
python3 -m pytest -q -s -p no:logging -m cuda tests/test_nvfuser_segments.py tests/test_nvfuser.py tests/test_inplace.py tests/test_rewrites.py 2>&1 | grep -v -i warn > $OUT/segments_tests.txt; tail -5 $OUT/segments_tests.txt
python3 -m thunder_fusion_guard report examples/report_target.py:make --thunderfx --device cuda --json $OUT/report_fx.json --markdown $OUT/report_fx.md > $OUT/report_fx.txt 2>&1; tail -3 $OUT/report_fx.txt
python3 -m thunder_fusion_guard report examples/report_target.py:make --device cuda --markdown $OUT/report_jit.md > $OUT/report_jit.txt 2>&1; tail -3 $OUT/report_jit.txt
python3 benchmarks/gpu_models.py --model Llama-2-7b-hf --variants eager,thunder,guarded --rounds 10 --out /tmp/tfg-gpu-models --json $OUT/h200-llama2-equality.json 2>&1 | grep -v -i warn | tail -2
TFG_COVERAGE_JSON=$OUT/cov_cuda.json timeout -s INT $((590 - SECONDS - 20)) python3 -m pytest -q -p no:logging -m cuda tests/test_opinfo_diff.py 2>&1 | grep -v -i warn | tail -40 > $OUT/opinfo_cuda.txt; tail -12 $OUT/opinfo_cuda.txt
