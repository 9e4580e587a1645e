"""sim.core"""
