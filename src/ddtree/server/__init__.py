"""ddtree.server"""
