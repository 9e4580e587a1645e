"""sim.timing"""
