"""What is trained and how it lies on the devices: the flax nnx decoder (``transformer``), its
attention (``attention``) and MoE layers (``moe``), the device mesh and the batch plan over it
(``mesh``), and the parameter and FLOP counts without flax (``sizes``). Imported by the step, the
evaluation and the loop; imports only the config."""
