"""ddtree.models"""
