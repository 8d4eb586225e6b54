# Absolute: MindSpore's compile cache parses the entry script's imports with no package
# (mindspore/graph/api.py, __get_compile_cache_dep_files) and fails on a relative one.
from llama_npu.cli import main

raise SystemExit(main())
