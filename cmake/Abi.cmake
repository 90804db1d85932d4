# `abi-baseline` target: regenerate abi/libflashattn.abi from this build (see
# abi/README.md). The packaging.abi test compares the build against that file.
find_program(FLASHATTN_ABIDW abidw)
if(FLASHATTN_ABIDW)
  add_custom_target(abi-baseline
    COMMAND ${CMAKE_COMMAND} -DABIDW=${FLASHATTN_ABIDW} -DLIB=$<TARGET_FILE:flashattn>
            -DSOURCE_DIR=${PROJECT_SOURCE_DIR} -DOUT=${PROJECT_SOURCE_DIR}/abi/libflashattn.abi
            -P ${PROJECT_SOURCE_DIR}/cmake/WriteAbiBaseline.cmake
    DEPENDS flashattn
    COMMENT "Writing the ABI baseline abi/libflashattn.abi"
    VERBATIM)
endif()
