"""topocoll.collectives"""
