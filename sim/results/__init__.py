"""sim.results"""
