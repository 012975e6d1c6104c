"""The EAGLE-3 draft model (model), its training-time-test loss (ttt) and loop (training), draft
vocabulary (vocab), target-layer ids (layers), export to the SGLang / vLLM checkpoint format
(export), and speculative decoding to measure it (speculate). Import the module you need: this
package imports nothing, so a stage that needs one module does not depend on the others."""
