"""sim.frontend"""
