"""ddtree.engine"""
