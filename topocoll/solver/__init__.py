"""topocoll.solver"""
