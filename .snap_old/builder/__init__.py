"""ttsaot builder: offline tracing, passes, torch.export + AOTInductor per bucket. May import the runtime."""
