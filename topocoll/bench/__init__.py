"""topocoll.bench"""
