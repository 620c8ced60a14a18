"""topocoll.topo"""
