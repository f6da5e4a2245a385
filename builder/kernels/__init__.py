"""Custom ops used by exported stages. Importing this package registers them."""

from .snake_beta import snake_beta, snake_beta_nlc, snake_beta_nlc_reference, snake_beta_reference

__all__ = ["snake_beta", "snake_beta_nlc", "snake_beta_nlc_reference", "snake_beta_reference"]
