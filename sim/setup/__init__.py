"""sim.setup"""
