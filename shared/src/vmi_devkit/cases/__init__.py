"""Case tables shared by several test modules of one op family: configuration matrices (covering
sets and full products), input builders and the targets the kernel tests run on."""
