"""ddtree.bench"""
