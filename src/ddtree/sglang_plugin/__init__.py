"""ddtree.sglang_plugin"""
