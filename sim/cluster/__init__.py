"""sim.cluster"""
