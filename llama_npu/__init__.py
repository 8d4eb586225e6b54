"""llama-npu: fine-tune Llama 3.2 1B/3B on Chinese data with MindSpore on Ascend NPUs."""
__version__ = "0.1.0"
